// Faults a test injects into rank processes through the environment, to prove that one rank's failure ends a
// start-up at once, or fails one call on every rank and leaves the group usable. Nothing reads them unless set;
// they are no recipe keys because no deployment wants them.
//   KILN_TEST_FAIL_LOAD=<rank>:<where>  rank <rank> fails its start-up, <where> = "rendezvous" (before it meets the
//                                       others) or "build" (after meeting them, in place of building its shard)
//   KILN_TEST_FAIL_STEP=<rank>:<file>   rank <rank>'s next step fails while <file> exists; the rank deletes the
//                                       file, so exactly one step fails per file a test creates
//   KILN_TEST_HANG_STEP=<rank>:<seconds>:<file>  rank <rank>'s next step sleeps <seconds> (alive, but never reaching
//                                       the others) while <file> exists; the rank deletes the file, as above
#pragma once

#include <string>

#include "kiln/status.h"

namespace kiln {

enum class LoadFaultPoint { kRendezvous, kBuild };

// The injected error when KILN_TEST_FAIL_LOAD names this rank and this point; OK otherwise.
Status injected_load_fault(int rank, LoadFaultPoint point);
// The injected error when KILN_TEST_FAIL_STEP names this rank and its file exists (which it deletes); OK otherwise.
Status injected_step_fault(int rank);
// Sleeps when KILN_TEST_HANG_STEP names this rank and its file exists (which it deletes); returns at once otherwise.
void injected_step_hang(int rank);

}  // namespace kiln
