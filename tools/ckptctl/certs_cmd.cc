// `ckptctl certs init|issue`: the deployment's certificate authority and the certificates of
// its coordinator, workers and operators (docs/services.md, Security). Keys are ECDSA P-256;
// each certificate's role is the SAN URI "ckpt://role/<role>" (and its subject OU), its name
// the subject CN; coordinator certificates also carry the SAN DNS name "ckpt-coordinator",
// which clients verify. Private keys are written with mode 0600 and never overwritten.
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/transport_security.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/commands.h"

namespace ckpt::ckptctl {
namespace {

struct Deleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
  void operator()(ASN1_INTEGER* p) const { ASN1_INTEGER_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
template <typename T>
using Owned = std::unique_ptr<T, Deleter>;

absl::Status OpenSslError(absl::string_view what) {
  char buffer[256] = "unknown error";
  unsigned long code = ERR_get_error();
  if (code != 0) ERR_error_string_n(code, buffer, sizeof(buffer));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat(what, ": ", buffer));
}

// Writes `bytes` to a new file `path` with `mode`; AlreadyExists when it is there.
absl::Status WriteNewFile(const std::string& path, const std::string& bytes, mode_t mode) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, " exists; remove it first if you mean to replace it"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  bool ok = fchmod(fd, mode) == 0 &&
            write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()) &&
            fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  if (!ok) return absl::DataLossError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

template <typename Writer>
absl::StatusOr<std::string> ToPem(Writer write) {
  Owned<BIO> bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || !write(bio.get())) return OpenSslError("PEM encoding");
  char* data = nullptr;
  long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer, cert, nullptr, nullptr, 0);
  Owned<X509_EXTENSION> ext(X509V3_EXT_conf_nid(nullptr, &context, nid, value.c_str()));
  if (ext == nullptr || X509_add_ext(cert, ext.get(), -1) != 1) {
    return OpenSslError(absl::StrCat("certificate extension ", OBJ_nid2sn(nid), "=", value));
  }
  return absl::OkStatus();
}

// What a new certificate says about its holder.
struct Subject {
  std::string name;  // CN
  std::string unit;  // OU: the role, or "ca"
  int days = 825;
};

// An unsigned certificate for `key` whose issuer is `issuer`'s subject (its own subject when
// `issuer` is null: self-signed). Sign() signs it with the issuer's key.
absl::StatusOr<Owned<X509>> NewCertificate(const Subject& subject, EVP_PKEY* key, X509* issuer) {
  Owned<X509> cert(X509_new());
  Owned<BIGNUM> serial_number(BN_new());
  if (cert == nullptr || serial_number == nullptr ||
      BN_rand(serial_number.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1) {
    return OpenSslError("new certificate");
  }
  Owned<ASN1_INTEGER> serial(BN_to_ASN1_INTEGER(serial_number.get(), nullptr));
  X509_NAME* name = X509_get_subject_name(cert.get());
  bool ok = serial != nullptr && X509_set_version(cert.get(), 2) == 1 &&
            X509_set_serialNumber(cert.get(), serial.get()) == 1 &&
            X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300) != nullptr &&
            X509_gmtime_adj(X509_getm_notAfter(cert.get()), 86400L * subject.days) != nullptr &&
            X509_set_pubkey(cert.get(), key) == 1;
  for (const auto& [field, value] : std::vector<std::pair<const char*, std::string>>{
           {"O", "ckpt"}, {"OU", subject.unit}, {"CN", subject.name}}) {
    ok = ok && X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8,
                                          reinterpret_cast<const unsigned char*>(value.c_str()), -1,
                                          -1, 0) == 1;
  }
  ok = ok && X509_set_issuer_name(cert.get(),
                                  issuer != nullptr ? X509_get_subject_name(issuer) : name) == 1;
  if (!ok) return OpenSslError("certificate fields");
  return cert;
}

absl::Status Sign(X509* cert, EVP_PKEY* key) {
  if (X509_sign(cert, key, EVP_sha256()) <= 0) return OpenSslError("signing the certificate");
  return absl::OkStatus();
}

// Writes DIR/<stem>.pem and DIR/<stem>.key (0600); neither may exist.
absl::Status WritePair(const std::string& dir, const std::string& stem, X509* cert, EVP_PKEY* key) {
  absl::StatusOr<std::string> cert_pem = ToPem([&](BIO* b) { return PEM_write_bio_X509(b, cert); });
  absl::StatusOr<std::string> key_pem = ToPem([&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr);
  });
  if (!cert_pem.ok()) return cert_pem.status();
  if (!key_pem.ok()) return key_pem.status();
  const std::string key_path = absl::StrCat(dir, "/", stem, ".key");
  const std::string cert_path = absl::StrCat(dir, "/", stem, ".pem");
  for (const std::string& path : {key_path, cert_path}) {
    if (access(path.c_str(), F_OK) == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, " exists; remove it first if you mean to replace it"));
    }
  }
  if (absl::Status s = WriteNewFile(key_path, *key_pem, 0600); !s.ok()) return s;
  if (absl::Status s = WriteNewFile(cert_path, *cert_pem, 0644); !s.ok()) return s;
  std::printf("wrote %s\nwrote %s (private: mode 0600)\n", cert_path.c_str(), key_path.c_str());
  return absl::OkStatus();
}

absl::StatusOr<Owned<EVP_PKEY>> NewKey() {
  Owned<EVP_PKEY> key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("generating an ECDSA P-256 key");
  return key;
}

absl::Status Init(const std::string& dir, int days) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  absl::StatusOr<Owned<EVP_PKEY>> key = NewKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<Owned<X509>> cert = NewCertificate({"ckpt CA", "ca", days}, key->get(), nullptr);
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  for (const auto& [nid, value] : std::vector<std::pair<int, std::string>>{
           {NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
           {NID_key_usage, "critical,keyCertSign,cRLSign"},
           {NID_subject_key_identifier, "hash"}}) {
    if (absl::Status s = AddExtension(c, c, nid, value); !s.ok()) return s;
  }
  if (absl::Status s = Sign(c, key->get()); !s.ok()) return s;
  return WritePair(dir, "ca", c, key->get());
}

// Reads a PEM file with `read` (PEM_read_bio_X509 or PEM_read_bio_PrivateKey).
template <typename T, typename Reader>
absl::StatusOr<Owned<T>> ReadPemFile(const std::string& path, Reader read) {
  Owned<BIO> bio(BIO_new_file(path.c_str(), "r"));
  if (bio == nullptr) {
    ERR_clear_error();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", path, " (run `ckptctl certs init --dir DIR` first)"));
  }
  Owned<T> value(read(bio.get()));
  if (value == nullptr) return OpenSslError(absl::StrCat("reading ", path));
  return value;
}

// DIR/ca.key, read as the daemons read their own keys (ReadPrivateKeyPem: refused when other
// users may read it), and checked against the CA certificate `ca` (DIR/ca.pem): a key of
// another CA would sign certificates nobody can verify. FailedPrecondition naming the file.
absl::StatusOr<Owned<EVP_PKEY>> ReadCaKey(const std::string& dir, X509* ca) {
  const std::string path = absl::StrCat(dir, "/ca.key");
  absl::StatusOr<std::string> pem = ReadPrivateKeyPem(path, "CA private key");
  if (!pem.ok()) return pem.status();
  Owned<BIO> bio(BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())));
  if (bio == nullptr) return OpenSslError(absl::StrCat("reading ", path));
  Owned<EVP_PKEY> key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) return OpenSslError(absl::StrCat("reading ", path));
  if (X509_check_private_key(ca, key.get()) != 1) {
    ERR_clear_error();
    return absl::FailedPreconditionError(
        absl::StrCat("the CA private key ", path, " does not match the CA certificate ", dir,
                     "/ca.pem (a certificate it signed would fail verification); put the key "
                     "that `ckptctl certs init` made with that certificate back"));
  }
  return key;
}

absl::Status Issue(const std::string& dir, Role role, const std::string& name, int days) {
  auto ca = ReadPemFile<X509>(absl::StrCat(dir, "/ca.pem"), [](BIO* b) {
    return PEM_read_bio_X509(b, nullptr, nullptr, nullptr);
  });
  if (!ca.ok()) return ca.status();
  auto ca_key = ReadCaKey(dir, ca->get());
  if (!ca_key.ok()) return ca_key.status();
  absl::StatusOr<Owned<EVP_PKEY>> key = NewKey();
  if (!key.ok()) return key.status();
  const std::string role_name(RoleName(role));
  absl::StatusOr<Owned<X509>> cert = NewCertificate({name, role_name, days}, key->get(), ca->get());
  if (!cert.ok()) return cert.status();
  std::string san = absl::StrCat("URI:", RoleUri(role));
  if (role == Role::kCoordinator) absl::StrAppend(&san, ",DNS:", kCoordinatorServerName);
  for (const auto& [nid, value] : std::vector<std::pair<int, std::string>>{
           {NID_basic_constraints, "critical,CA:FALSE"},
           {NID_key_usage, "critical,digitalSignature,keyAgreement"},
           {NID_ext_key_usage, role == Role::kCoordinator ? "serverAuth" : "clientAuth"},
           {NID_subject_alt_name, san},
           {NID_subject_key_identifier, "hash"},
           {NID_authority_key_identifier, "keyid:always"}}) {
    if (absl::Status s = AddExtension(cert->get(), ca->get(), nid, value); !s.ok()) return s;
  }
  if (absl::Status s = Sign(cert->get(), ca_key->get()); !s.ok()) return s;
  return WritePair(dir, absl::StrCat(role_name, "-", name), cert->get(), key->get());
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return false;
    }
  }
  return name[0] != '.';
}

}  // namespace

const CommandSpec& CertsSpec() {
  static const CommandSpec* spec = new CommandSpec{
      "certs",
      "usage: ckptctl certs init --dir DIR [--days N]\n"
      "       ckptctl certs issue --dir DIR --role coordinator|worker|operator --name NAME "
      "[--days N]",
      "Makes the certificates that authenticate a ckpt deployment (TLS with client\n"
      "certificates; docs/services.md, Security).\n"
      "  init   creates the certificate authority: DIR/ca.pem (give it to every party) and\n"
      "         DIR/ca.key (keep it private: whoever holds it can issue any role). Default\n"
      "         validity 3650 days.\n"
      "  issue  creates DIR/<role>-<name>.pem and DIR/<role>-<name>.key signed by the CA.\n"
      "         coordinator: the server certificate (ckpt_coordinator --tls_*);\n"
      "         worker:      what ckpt_worker presents (worker RPCs only, bound to the workers it\n"
      "                      registers); one per host is usual;\n"
      "         operator:    what ckptctl presents to request save/load/reshard/status.\n"
      "         NAME becomes the certificate's subject CN. Default validity 825 days.\n"
      "Existing files are never overwritten. Pass the files to the daemons as\n"
      "  --tls_ca DIR/ca.pem --tls_cert DIR/<role>-<name>.pem --tls_key DIR/<role>-<name>.key\n"
      "and to ckptctl as --tls-ca, --tls-cert, --tls-key (or CKPT_TLS_CA, CKPT_TLS_CERT and\n"
      "CKPT_TLS_KEY).\n",
      {{"dir", "DIR", "where the CA and the certificates are, required"},
       {"role", "ROLE", "issue: coordinator, worker or operator"},
       {"name", "NAME", "issue: the certificate's subject CN (1-64 of [A-Za-z0-9._-])"},
       {"days", "N", "validity in days (default 3650 for init, 825 for issue)"}}};
  return *spec;
}

int RunCertsCommand(const std::vector<std::string>& args) {
  const std::string cmd = "certs";
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(CertsSpec(), args, &a)) return *code;
  if (a.positional.size() != 1) return Usage(cmd, "expected one action: init or issue");
  const std::string action = a.positional[0];
  const std::string dir = a.Get("dir"), role_name = a.Get("role"), name = a.Get("name");
  int days = action == "init" ? 3650 : 825;
  if (absl::Status s = IntFlag(a, "days", 1, 36500, &days); !s.ok()) {
    return Usage(cmd, std::string(s.message()));
  }
  if (dir.empty()) return Usage(cmd, "--dir is required");
  absl::Status s;
  if (action == "init") {
    s = Init(dir, days);
  } else if (action == "issue") {
    std::optional<Role> role = RoleFromName(role_name);
    if (!role.has_value()) return Usage(cmd, "--role must be coordinator, worker or operator");
    if (!ValidName(name))
      return Usage(cmd, "--name must be 1-64 of [A-Za-z0-9._-], not starting '.'");
    s = Issue(dir, *role, name, days);
  } else {
    return Usage(cmd, absl::StrCat("unknown action \"", action, "\"; use init or issue"));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "ckptctl certs %s: %s\n", action.c_str(),
                 std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace ckpt::ckptctl
