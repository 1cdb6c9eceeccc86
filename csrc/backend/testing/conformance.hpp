// The driver-seam conformance check, run against a fresh backend (conformance.cpp).
//
// Owns: the one entry point of the check. The C ABI (capi/testing/conformance_capi.cpp) only
// copies the report out. Invariants: everything the check creates is released before it
// returns; it never throws (every failure is a Status or a failed check in the report).
#pragma once

#include <string>

#include "backend/status.hpp"

namespace vta {

// Runs every check on a new backend of `kind` (VTA_BACKEND_*) for `device`: *report gets one
// header line ("<backend>: N checks, F failed"), a line per check and the summary by evidence
// tag; *failures the failed checks. A backend that cannot be made is the returned Status.
Status run_conformance(int kind, int device, std::string* report, int* failures);

}  // namespace vta
