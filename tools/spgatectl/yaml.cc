// JSON -> YAML for spgatectl; see yaml.h.
#include "tools/spgatectl/yaml.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace spgate::ctl {
namespace {

// A parsed JSON value. Scalars keep their source text (a string with its quotes and
// escapes), so nothing is decoded and re-encoded.
struct Node {
  enum class Kind { kScalar, kObject, kArray } kind = Kind::kScalar;
  std::string scalar;
  std::vector<std::pair<std::string, Node>> members;  // keys as source text, quoted
  std::vector<Node> items;
};

// Deep enough for any admin API message; a deeper document is refused, not a stack
// overflow.
constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Node> ParseDocument() {
    Node n;
    if (absl::Status s = Value(&n, 0); !s.ok()) return s;
    SkipSpace();
    if (pos_ != text_.size()) return Error("trailing characters");
    return n;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("JSON at offset ", pos_, ": ", what));
  }
  void SkipSpace() {
    while (pos_ < text_.size() && absl::ascii_isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Eat(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::Status String(std::string* out) {
    const size_t start = pos_;
    if (pos_ >= text_.size() || text_[pos_] != '"') return Error("expected a string");
    for (++pos_; pos_ < text_.size(); ++pos_) {
      if (text_[pos_] == '\\') {
        ++pos_;
      } else if (text_[pos_] == '"') {
        ++pos_;
        *out = std::string(text_.substr(start, pos_ - start));
        return absl::OkStatus();
      }
    }
    return Error("unterminated string");
  }

  absl::Status Value(Node* n, int depth) {
    if (depth > kMaxDepth) return Error("nested too deeply");
    SkipSpace();
    if (pos_ >= text_.size()) return Error("unexpected end");
    const char c = text_[pos_];
    if (c == '{') {
      ++pos_;
      n->kind = Node::Kind::kObject;
      if (Eat('}')) return absl::OkStatus();
      do {
        SkipSpace();
        std::pair<std::string, Node> member;
        if (absl::Status s = String(&member.first); !s.ok()) return s;
        if (!Eat(':')) return Error("expected ':'");
        if (absl::Status s = Value(&member.second, depth + 1); !s.ok()) return s;
        n->members.push_back(std::move(member));
      } while (Eat(','));
      return Eat('}') ? absl::OkStatus() : Error("expected ',' or '}'");
    }
    if (c == '[') {
      ++pos_;
      n->kind = Node::Kind::kArray;
      if (Eat(']')) return absl::OkStatus();
      do {
        n->items.emplace_back();
        if (absl::Status s = Value(&n->items.back(), depth + 1); !s.ok()) return s;
      } while (Eat(','));
      return Eat(']') ? absl::OkStatus() : Error("expected ',' or ']'");
    }
    if (c == '"') return String(&n->scalar);
    const size_t start = pos_;
    while (pos_ < text_.size() && (absl::ascii_isalnum(static_cast<unsigned char>(text_[pos_])) ||
                                   text_[pos_] == '-' || text_[pos_] == '+' || text_[pos_] == '.')) {
      ++pos_;
    }
    if (pos_ == start) return Error("unexpected character");
    n->scalar = std::string(text_.substr(start, pos_ - start));
    return absl::OkStatus();
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

bool Inline(const Node& n) {
  return n.kind == Node::Kind::kScalar || (n.kind == Node::Kind::kObject && n.members.empty()) ||
         (n.kind == Node::Kind::kArray && n.items.empty());
}

// A JSON number in the form YAML 1.1 readers (PyYAML) also take for a float: they need a
// '.' and a signed exponent, so "1e-05" becomes "1.0e-05" and "1e5" "1.0e+5".
std::string YamlNumber(const std::string& number) {
  const size_t e = number.find_first_of("eE");
  if (e == std::string::npos) return number;
  std::string mantissa = number.substr(0, e);
  std::string exponent = number.substr(e + 1);
  if (mantissa.find('.') == std::string::npos) mantissa += ".0";
  if (!exponent.empty() && exponent[0] != '-' && exponent[0] != '+') exponent = "+" + exponent;
  return absl::StrCat(mantissa, "e", exponent);
}

std::string InlineText(const Node& n) {
  if (n.kind == Node::Kind::kObject) return "{}";
  if (n.kind == Node::Kind::kArray) return "[]";
  const char c = n.scalar.empty() ? ' ' : n.scalar[0];
  if (c == '-' || absl::ascii_isdigit(static_cast<unsigned char>(c))) return YamlNumber(n.scalar);
  return n.scalar;
}

// A key as YAML: plain when it is an identifier no YAML 1.1 reader takes for a boolean
// or null ("on", "no", "y"), else the JSON-quoted text.
std::string Key(const std::string& quoted) {
  const std::string bare = quoted.substr(1, quoted.size() - 2);
  static constexpr absl::string_view kSpecial[] = {"y", "n", "yes", "no", "on", "off",
                                                   "true", "false", "null"};
  bool plain = !bare.empty() && (absl::ascii_isalpha(bare[0]) || bare[0] == '_');
  for (char c : bare) plain = plain && (absl::ascii_isalnum(c) || c == '_');
  for (absl::string_view s : kSpecial) plain = plain && absl::AsciiStrToLower(bare) != s;
  return plain ? bare : quoted;
}

// Block YAML of a container at `indent` spaces, one line per scalar.
void Emit(const Node& n, int indent, std::string* out) {
  const std::string pad(indent, ' ');
  if (n.kind == Node::Kind::kObject) {
    for (const auto& [key, value] : n.members) {
      if (Inline(value)) {
        absl::StrAppend(out, pad, Key(key), ": ", InlineText(value), "\n");
      } else {
        absl::StrAppend(out, pad, Key(key), ":\n");
        Emit(value, indent + 2, out);
      }
    }
    return;
  }
  for (const Node& item : n.items) {
    if (Inline(item)) {
      absl::StrAppend(out, pad, "- ", InlineText(item), "\n");
      continue;
    }
    // "- " takes the place of the nested block's first indentation.
    std::string nested;
    Emit(item, indent + 2, &nested);
    absl::StrAppend(out, pad, "- ", absl::string_view(nested).substr(indent + 2));
  }
}

}  // namespace

absl::StatusOr<std::string> JsonToYaml(absl::string_view json) {
  absl::StatusOr<Node> root = Parser(json).ParseDocument();
  if (!root.ok()) return root.status();
  if (Inline(*root)) return absl::StrCat(InlineText(*root), "\n");
  std::string out;
  Emit(*root, 0, &out);
  return out;
}

}  // namespace spgate::ctl
