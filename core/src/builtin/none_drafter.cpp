#include "builtin/none_drafter.h"

namespace kiln::builtin {
namespace {

class NoneDrafter final : public Drafter {
 public:
  DrafterCapabilities capabilities() const override { return {}; }

  Status propose(const DraftStep& step, std::vector<DraftProposal>& out) override {
    return failed_precondition("drafting is off (`[speculative] method = \"none\"`): the `none` drafter proposes "
                               "nothing; choose a drafter such as `mtp` to speculate");
  }

  // Keeps no per-sequence state, so there is nothing to roll back or release.
  Status rollback(int64_t, int64_t) override { return ok_status(); }
  void release(int64_t) override {}
};

}  // namespace

Result<std::unique_ptr<Drafter>> create_none_drafter(const CreateContext&) {
  return std::unique_ptr<Drafter>(new NoneDrafter());
}

}  // namespace kiln::builtin
