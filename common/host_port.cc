#include "common/host_port.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace spgate {

AddressParts SplitAddress(absl::string_view address) {
  AddressParts p;
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    p.unix = true;
    return p;
  }
  const size_t colon = address.rfind(':');
  p.has_colon = colon != absl::string_view::npos;
  p.host = p.has_colon ? std::string(address.substr(0, colon)) : "";
  p.port = std::string(p.has_colon ? address.substr(colon + 1) : address);
  if (p.host.size() >= 2 && p.host.front() == '[' && p.host.back() == ']') {
    p.host = p.host.substr(1, p.host.size() - 2);
    p.bracketed = true;
  }
  return p;
}

int PortNumber(const AddressParts& parts) {
  int port = -1;
  if (parts.port.empty() || parts.port.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(parts.port, &port) || port > 65535) {
    return -1;
  }
  return port;
}

}  // namespace spgate
