// AgreeOnLaunch (worker.h): world rank 0's incarnation and launch credential, broadcast
// over the job's world so every rank registers the same launch (docs/design.md §10). Rank
// 0's error reaches every rank as its code, so none waits alone and all fail alike.
#include "worker/runtime/worker.h"

#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/launch_credential.h"
#include "common/status_macros.h"
#include "worker/client/identity.h"

namespace spgate::runtime {
namespace {

// What world rank 0 broadcasts (AgreeOnLaunch): its launch identity, or the code of why it
// has none, so no rank waits alone and all fail alike. The daemon takes at most 128
// characters of the incarnation and of the credential.
constexpr size_t kMaxLaunchValue = 128;
struct LaunchWire {
  int32_t status_code = 0;
  char incarnation[kMaxLaunchValue + 1] = {};
  char launch_credential[kMaxLaunchValue + 1] = {};
};
static_assert(std::is_trivially_copyable_v<LaunchWire>);

// World rank 0's identity of the launch: the options', else the launcher's incarnation
// and a new credential. Both must fit the broadcast (the daemon takes at most 128
// characters of either), never be cut to fit.
absl::StatusOr<LaunchIdentity> RootLaunch(const WorkerOptions& o) {
  LaunchIdentity id{o.client.incarnation, o.client.launch_credential};
  if (id.incarnation.empty()) id.incarnation = client::IncarnationFromEnvironment();
  if (id.incarnation.empty()) id.incarnation = client::NewIncarnation();
  if (id.launch_credential.empty()) {
    ASSIGN_OR_RETURN(id.launch_credential, client::NewLaunchCredential());
  }
  if (id.incarnation.size() > kMaxLaunchValue) {
    return absl::InvalidArgumentError(absl::StrCat(
        "incarnation: at most 128 characters, got ", id.incarnation.size()));
  }
  RETURN_IF_ERROR(CheckLaunchCredential(id.launch_credential, "SPGATE_LAUNCH_CREDENTIAL"));
  return id;
}

}  // namespace

absl::StatusOr<LaunchIdentity> AgreeOnLaunch(const WorkerOptions& o, const ProcessGrid& grid) {
  if (o.client.controller.empty()) {
    const std::string& given = o.client.incarnation;
    return LaunchIdentity{given.empty() ? client::IncarnationFromEnvironment() : given, ""};
  }
  LaunchWire wire;
  absl::Status root_status;
  if (grid.world_rank() == 0) {
    absl::StatusOr<LaunchIdentity> id = RootLaunch(o);
    if (id.ok()) {
      id->incarnation.copy(wire.incarnation, sizeof(wire.incarnation) - 1);
      id->launch_credential.copy(wire.launch_credential, sizeof(wire.launch_credential) - 1);
    } else {
      root_status = id.status();
      wire.status_code = static_cast<int32_t>(root_status.code());
    }
  }
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Bcast(&wire, sizeof(wire), MPI_BYTE, 0, grid.world()));
  if (!root_status.ok()) return root_status;
  if (wire.status_code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(wire.status_code),
                        "world rank 0 could not set up the launch's identity (its log says why)");
  }
  return LaunchIdentity{wire.incarnation, wire.launch_credential};
}

}  // namespace spgate::runtime
