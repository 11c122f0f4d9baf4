// ParseTextFormat: see text_format.h.
#include "proto/text_format.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/io/tokenizer.h"

namespace spgate {
namespace {

// Keeps the first error; the parser stops at it.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) {
      first_ = absl::StrFormat("line %d column %d: %s", line + 1, column + 1, message);
    }
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

}  // namespace

absl::Status ParseTextFormat(const std::string& text, google::protobuf::Message* out,
                             google::protobuf::TextFormat::ParseInfoTree* locations) {
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (locations != nullptr) parser.WriteLocationsTo(locations);
  if (parser.ParseFromString(text, out)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("not a valid ", out->GetDescriptor()->full_name(), " in text format: ",
                   errors.first().empty() ? "parse error" : errors.first()));
}

}  // namespace spgate
