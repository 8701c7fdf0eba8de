#include "proto/deterministic.h"

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace ckpt {

std::string SerializeDeterministically(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return out;
}

namespace {

// The tag and length of a length-delimited field of `size` bytes.
void AppendFieldHead(int field_number, size_t size, std::string* out) {
  uint8_t varint[10];
  const uint32_t tag = (static_cast<uint32_t>(field_number) << 3) | 2;  // length-delimited
  uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint32ToArray(tag, varint);
  out->append(reinterpret_cast<const char*>(varint), end - varint);
  end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(size, varint);
  out->append(reinterpret_cast<const char*>(varint), end - varint);
}

}  // namespace

void AppendBytesField(int field_number, const std::string& bytes, std::string* out) {
  AppendFieldHead(field_number, bytes.size(), out);
  out->append(bytes);
}

void AppendMessageField(int field_number, const google::protobuf::MessageLite& message,
                        std::string* out) {
  const size_t size = message.ByteSizeLong();
  AppendFieldHead(field_number, size, out);
  const size_t at = out->size();
  out->resize(at + size);
  google::protobuf::io::ArrayOutputStream array(out->data() + at, static_cast<int>(size));
  google::protobuf::io::CodedOutputStream coded(&array);
  coded.SetSerializationDeterministic(true);
  message.SerializeWithCachedSizes(&coded);  // the sizes ByteSizeLong just cached
}

}  // namespace ckpt
