// ParseTextFormat: see text_format.h.
#include "proto/text_format.h"

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace spgate {
namespace {

// Swallows what the second pass over a text (EnumValuePlace) finds: the parser reported it.
class NoErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int, int, const std::string&) override {}
  void AddWarning(int, int, const std::string&) override {}
};

// Keeps the first error; the parser stops at it.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (!has_error_) {
      has_error_ = true;
      line_ = line;
      column_ = column;
      message_ = message;
    }
  }
  void AddWarning(int, int, const std::string&) override {}
  bool has_error() const { return has_error_; }
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& message() const { return message_; }

 private:
  bool has_error_ = false;
  int line_ = 0, column_ = 0;  // 0-based, as the tokenizer counts
  std::string message_;
};

// Where the parser's error points for an unknown enum value: the tokenizer has already
// read past the value, so the error names the next token's place (the next line's start
// when the value ends its line). The place of the value itself: the last token spelling it
// before the reported place, read with the parser's own tokenizer (so a comment that
// mentions the value is not taken for it); the reported place where there is none.
std::pair<int, int> EnumValuePlace(const std::string& text, const FirstError& e) {
  constexpr std::string_view kPrefix = "Unknown enumeration value of \"";
  const std::string& m = e.message();
  if (!m.starts_with(kPrefix)) return {e.line(), e.column()};
  const size_t end = m.find('"', kPrefix.size());
  if (end == std::string::npos || end == kPrefix.size()) return {e.line(), e.column()};
  const std::string value = m.substr(kPrefix.size(), end - kPrefix.size());
  google::protobuf::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  NoErrors quiet;
  google::protobuf::io::Tokenizer tokens(&input, &quiet);
  tokens.set_comment_style(google::protobuf::io::Tokenizer::SH_COMMENT_STYLE);
  std::pair<int, int> place = {e.line(), e.column()};
  while (tokens.Next()) {
    const google::protobuf::io::Tokenizer::Token& t = tokens.current();
    if (std::pair(t.line, t.column) >= std::pair(e.line(), e.column())) break;
    if (t.text == value) place = {t.line, t.column};
  }
  return place;
}

}  // namespace

absl::Status ParseTextFormat(const std::string& text, google::protobuf::Message* out,
                             google::protobuf::TextFormat::ParseInfoTree* locations) {
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (locations != nullptr) parser.WriteLocationsTo(locations);
  if (parser.ParseFromString(text, out)) return absl::OkStatus();
  std::string where = "parse error";
  if (errors.has_error()) {
    const auto [line, column] = EnumValuePlace(text, errors);
    where = absl::StrFormat("line %d column %d: %s", line + 1, column + 1, errors.message());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "not a valid ", out->GetDescriptor()->full_name(), " in text format: ", where));
}

}  // namespace spgate
