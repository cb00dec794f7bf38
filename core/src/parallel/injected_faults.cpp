#include "parallel/injected_faults.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace kiln {
namespace {

// "<rank>:<rest>" when the variable is set and names `rank`.
bool names_rank(const char* variable, int rank, std::string& rest) {
  const char* value = std::getenv(variable);
  if (!value) return false;
  const std::string v = value;
  const size_t colon = v.find(':');
  if (colon == std::string::npos || v.substr(0, colon) != std::to_string(rank)) return false;
  rest = v.substr(colon + 1);
  return true;
}

}  // namespace

Status injected_load_fault(int rank, LoadFaultPoint point) {
  std::string where;
  if (!names_rank("KILN_TEST_FAIL_LOAD", rank, where)) return ok_status();
  if (where != (point == LoadFaultPoint::kRendezvous ? "rendezvous" : "build")) return ok_status();
  return failed_precondition("rank " + std::to_string(rank) + ": injected start-up failure at " + where +
                             " (KILN_TEST_FAIL_LOAD)");
}

Status injected_step_fault(int rank) {
  std::string file;
  if (!names_rank("KILN_TEST_FAIL_STEP", rank, file) || std::remove(file.c_str()) != 0) return ok_status();
  return internal_error("injected step failure (KILN_TEST_FAIL_STEP)");
}

void injected_step_hang(int rank) {
  std::string rest;
  if (!names_rank("KILN_TEST_HANG_STEP", rank, rest)) return;
  const size_t colon = rest.find(':');
  if (colon == std::string::npos) return;
  const std::string file = rest.substr(colon + 1);
  if (std::remove(file.c_str()) != 0) return;
  std::this_thread::sleep_for(std::chrono::duration<double>(std::strtod(rest.substr(0, colon).c_str(), nullptr)));
}

}  // namespace kiln
