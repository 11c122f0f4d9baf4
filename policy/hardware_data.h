// The text of policy/hardware/presets.csv and collectives.csv, embedded at build time
// (policy/CMakeLists.txt generates the definitions from hardware/hardware_data.cc.in), so
// the binaries need no data path at run time. Read them through policy/hardware.h.
#ifndef SPGATE_POLICY_HARDWARE_DATA_H_
#define SPGATE_POLICY_HARDWARE_DATA_H_

namespace spgate::hardware_data {

extern const char kPresetsCsv[];
extern const char kCollectivesCsv[];

}  // namespace spgate::hardware_data

#endif  // SPGATE_POLICY_HARDWARE_DATA_H_
