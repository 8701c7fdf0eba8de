// The XML of S3's REST API: responses parsed by expat into a small element tree, request
// bodies built with escaping. Pure: no I/O.
#ifndef CKPT_STORAGE_S3_S3_XML_H_
#define CKPT_STORAGE_S3_S3_XML_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// One element: its local name (any namespace prefix removed), its text and its children.
struct XmlElement {
  std::string name;
  std::string text;  // character data directly inside this element
  std::vector<XmlElement> children;

  // The first child named `name`, or nullptr.
  const XmlElement* Child(absl::string_view child_name) const;
  // The text of the first child named `name`, or "" when there is none.
  std::string ChildText(absl::string_view child_name) const;
  // Every child named `name`, in document order.
  std::vector<const XmlElement*> Children(absl::string_view child_name) const;
};

// Parses a whole document with expat (no DTD processing: external entities are never loaded;
// expat 2.4+ refuses entity amplification). InvalidArgument naming line and expat's reason.
absl::StatusOr<XmlElement> ParseXml(absl::string_view xml);

// `s` with &, <, >, " and ' escaped for element text or attribute values.
std::string XmlEscape(absl::string_view s);

}  // namespace ckpt

#endif  // CKPT_STORAGE_S3_S3_XML_H_
