#include "herald_microhttpd.h"
