// The portable MX loops (mx_impl.h), compiled without ISA flags.
#include <algorithm>
#include <vector>

#include "mx/mx_impl.h"

QUANTA_MX_GENERIC_ENTRY_POINTS(portable)
