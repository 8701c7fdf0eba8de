#include "storage/s3/s3_xml.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

TEST(ParseXml, ReadsAnS3ListingWithItsNamespace) {
  absl::StatusOr<XmlElement> doc = ParseXml(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
      "<IsTruncated>true</IsTruncated>"
      "<Contents><Key>a&amp;b&lt;c</Key><Size>12</Size></Contents>"
      "<Contents><Key>d</Key><Size>3</Size></Contents>"
      "<NextContinuationToken>tok</NextContinuationToken></ListBucketResult>");
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(doc->name, "ListBucketResult");
  EXPECT_EQ(doc->ChildText("IsTruncated"), "true");
  ASSERT_EQ(doc->Children("Contents").size(), 2u);
  EXPECT_EQ(doc->Children("Contents")[0]->ChildText("Key"), "a&b<c");
  EXPECT_EQ(doc->Children("Contents")[1]->ChildText("Size"), "3");
  EXPECT_EQ(doc->ChildText("Missing"), "");
  EXPECT_EQ(doc->Child("Missing"), nullptr);
}

TEST(ParseXml, RefusesMalformedDocumentsNamingTheLine) {
  absl::StatusOr<XmlElement> doc = ParseXml("<Error>\n<Code>x</Error>");
  ASSERT_FALSE(doc.ok());
  EXPECT_THAT(doc.status().message(), HasSubstr("line 2"));
  EXPECT_FALSE(ParseXml("").ok());
  EXPECT_FALSE(ParseXml("<a></a><b></b>").ok());
}

TEST(ParseXml, RefusesDeepNesting) {
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "<a>";
  for (int i = 0; i < 100; ++i) deep += "</a>";
  absl::StatusOr<XmlElement> doc = ParseXml(deep);
  ASSERT_FALSE(doc.ok());
  EXPECT_THAT(doc.status().message(), HasSubstr("deeper"));
}

TEST(ParseXml, DoesNotExpandEntityBombs) {
  std::string bomb = "<?xml version=\"1.0\"?><!DOCTYPE r [<!ENTITY a \"aaaaaaaaaa\">";
  std::string prev = "a";
  for (int i = 0; i < 9; ++i) {
    std::string name = "e" + std::to_string(i);
    bomb += "<!ENTITY " + name + " \"";
    for (int j = 0; j < 10; ++j) bomb += "&" + prev + ";";
    bomb += "\">";
    prev = name;
  }
  bomb += "]><r>&" + prev + ";</r>";
  absl::StatusOr<XmlElement> doc = ParseXml(bomb);
  EXPECT_FALSE(doc.ok());  // expat >= 2.4 stops the amplification
}

TEST(XmlEscape, EscapesTheFiveSpecialCharacters) {
  EXPECT_EQ(XmlEscape("a&b<c>d\"e'f"), "a&amp;b&lt;c&gt;d&quot;e&apos;f");
  absl::StatusOr<XmlElement> doc = ParseXml("<K>" + XmlEscape("x&<y>\"'") + "</K>");
  ASSERT_TRUE(doc.ok());
  EXPECT_EQ(doc->text, "x&<y>\"'");
}

}  // namespace
}  // namespace ckpt
