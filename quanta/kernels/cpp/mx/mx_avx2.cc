// The generic MX loops (mx_impl.h) compiled with -mavx2 -mfma (the compiler vectorizes them;
// -ffp-contract=off keeps every multiply and add a separate rounding).
#include <algorithm>
#include <vector>

#include "mx/mx_impl.h"

QUANTA_MX_GENERIC_ENTRY_POINTS(avx2)
