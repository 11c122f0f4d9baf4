// ParseTextFormat: see text_format.h.
#include "proto/text_format.h"

#include <algorithm>
#include <cctype>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/io/tokenizer.h"

namespace spgate {
namespace {

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
// when the value ends its line). The place of the value itself: its last whole-word
// occurrence before the reported place, 0-based; the reported place where none is found.
std::pair<int, int> EnumValuePlace(const std::string& text, const FirstError& e) {
  constexpr std::string_view kPrefix = "Unknown enumeration value of \"";
  const std::string& m = e.message();
  if (!m.starts_with(kPrefix)) return {e.line(), e.column()};
  const size_t end = m.find('"', kPrefix.size());
  if (end == std::string::npos || end == kPrefix.size()) return {e.line(), e.column()};
  const std::string value = m.substr(kPrefix.size(), end - kPrefix.size());
  // The reported place as an offset (columns count tabs as the tokenizer does: to the next
  // multiple of 8; an offset past a tab-free line's end is clamped to it).
  size_t at = 0;
  for (int line = 0; line < e.line() && at < text.size(); ++at) {
    if (text[at] == '\n') ++line;
  }
  for (int column = 0; at < text.size() && text[at] != '\n' && column < e.column(); ++at) {
    column = text[at] == '\t' ? (column / 8 + 1) * 8 : column + 1;
  }
  auto word = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  if (at == 0) return {e.line(), e.column()};
  for (size_t pos = text.rfind(value, at - 1); pos != std::string::npos;
       pos = pos == 0 ? std::string::npos : text.rfind(value, pos - 1)) {
    const size_t after = pos + value.size();
    if ((pos > 0 && word(text[pos - 1])) || (after < text.size() && word(text[after]))) continue;
    const auto before = text.begin() + static_cast<std::ptrdiff_t>(pos);
    const int line = static_cast<int>(std::count(text.begin(), before, '\n'));
    int column = 0;
    for (auto i = std::find(std::make_reverse_iterator(before), text.rend(), '\n').base();
         i != before; ++i) {
      column = *i == '\t' ? (column / 8 + 1) * 8 : column + 1;
    }
    return {line, column};
  }
  return {e.line(), e.column()};
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
