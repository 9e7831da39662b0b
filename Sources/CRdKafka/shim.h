#ifndef HERALD_CRDKAFKA_SHIM_H
#define HERALD_CRDKAFKA_SHIM_H
// librdkafka ≥ 2.2 from the project's prefix (scripts/setup); Package.swift adds its include and lib paths.
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#endif
