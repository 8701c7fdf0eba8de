#include "storage/s3/s3_xml.h"

#include <expat.h>

#include <memory>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

constexpr int kMaxDepth = 32;  // S3's documents nest 3 or 4 deep

struct ParseState {
  XmlElement root;
  std::vector<XmlElement*> stack;  // open elements; empty before the root opens
  bool too_deep = false;
  XML_Parser parser = nullptr;
};

void OnStart(void* user, const XML_Char* name, const XML_Char** /*attrs*/) {
  auto* st = static_cast<ParseState*>(user);
  if (st->stack.size() >= kMaxDepth) {
    st->too_deep = true;
    XML_StopParser(st->parser, XML_FALSE);
    return;
  }
  absl::string_view local(name);
  if (size_t colon = local.rfind(':'); colon != absl::string_view::npos) {
    local.remove_prefix(colon + 1);
  }
  XmlElement* e;
  if (st->stack.empty()) {
    e = &st->root;
  } else {
    e = &st->stack.back()->children.emplace_back();
  }
  e->name = std::string(local);
  st->stack.push_back(e);
}

void OnEnd(void* user, const XML_Char* /*name*/) {
  static_cast<ParseState*>(user)->stack.pop_back();
}

void OnText(void* user, const XML_Char* s, int len) {
  auto* st = static_cast<ParseState*>(user);
  if (!st->stack.empty()) st->stack.back()->text.append(s, static_cast<size_t>(len));
}

}  // namespace

const XmlElement* XmlElement::Child(absl::string_view child_name) const {
  for (const XmlElement& c : children) {
    if (c.name == child_name) return &c;
  }
  return nullptr;
}

std::string XmlElement::ChildText(absl::string_view child_name) const {
  const XmlElement* c = Child(child_name);
  return c == nullptr ? "" : c->text;
}

std::vector<const XmlElement*> XmlElement::Children(absl::string_view child_name) const {
  std::vector<const XmlElement*> out;
  for (const XmlElement& c : children) {
    if (c.name == child_name) out.push_back(&c);
  }
  return out;
}

absl::StatusOr<XmlElement> ParseXml(absl::string_view xml) {
  std::unique_ptr<XML_ParserStruct, decltype(&XML_ParserFree)> parser(XML_ParserCreate("UTF-8"),
                                                                      &XML_ParserFree);
  if (parser == nullptr) return absl::ResourceExhaustedError("expat: cannot create a parser");
  ParseState st;
  st.parser = parser.get();
  XML_SetUserData(parser.get(), &st);
  XML_SetElementHandler(parser.get(), &OnStart, &OnEnd);
  XML_SetCharacterDataHandler(parser.get(), &OnText);
  XML_SetParamEntityParsing(parser.get(), XML_PARAM_ENTITY_PARSING_NEVER);
  if (xml.size() > (size_t{64} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("XML document of ", xml.size(), " bytes is larger than 64 MiB"));
  }
  const XML_Status rc = XML_Parse(parser.get(), xml.data(), static_cast<int>(xml.size()), XML_TRUE);
  if (st.too_deep) {
    return absl::InvalidArgumentError(
        absl::StrCat("XML document nests deeper than ", kMaxDepth, " elements"));
  }
  if (rc != XML_STATUS_OK) {
    return absl::InvalidArgumentError(
        absl::StrCat("XML not well-formed at line ", XML_GetCurrentLineNumber(parser.get()), ": ",
                     XML_ErrorString(XML_GetErrorCode(parser.get()))));
  }
  return std::move(st.root);
}

std::string XmlEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace ckpt
