#ifndef HERALD_CRDKAFKA_SHIM_H
#define HERALD_CRDKAFKA_SHIM_H
// librdkafka ≥ 2.10, found through pkg-config (scripts/setup installs it into /usr/local).
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#endif
