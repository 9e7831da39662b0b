#ifndef HERALD_CHIREDIS_SHIM_H
#define HERALD_CHIREDIS_SHIM_H
#include <hiredis/hiredis.h>
#endif
