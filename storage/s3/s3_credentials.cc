#include "storage/s3/s3_credentials.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace ckpt {
namespace {

using Section = std::map<std::string, std::string>;
using IniFile = std::map<std::string, Section>;

// An INI file's sections. Lines: "[section]", "key = value", blank, or "#"/";" comments.
// A malformed line is refused naming the file and line number, never its text (it may hold a
// secret).
absl::StatusOr<IniFile> ParseIni(const std::string& path, const std::string& text) {
  IniFile ini;
  Section* current = nullptr;
  std::istringstream in(text);
  std::string raw;
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']') {
        return absl::InvalidArgumentError(
            absl::StrCat("AWS file ", path, " line ", line_no, ": a section header without ']'"));
      }
      std::string name(absl::StripAsciiWhitespace(line.substr(1, line.size() - 2)));
      current = &ini[name];
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("AWS file ", path, " line ", line_no, ": expected 'key = value'"));
    }
    // Indented lines continue a nested setting (e.g. "s3 =\n  endpoint_url = ..."): skipped.
    if (raw.empty() || absl::ascii_isspace(static_cast<unsigned char>(raw[0]))) continue;
    if (current == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("AWS file ", path, " line ", line_no, ": a setting before any [section]"));
    }
    std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, eq)));
    (*current)[key] = std::string(absl::StripAsciiWhitespace(line.substr(eq + 1)));
  }
  return ini;
}

// The file's sections; an empty map when the file does not exist and `required` is false.
absl::StatusOr<IniFile> ReadIni(const std::string& path, bool required,
                                absl::string_view named_by) {
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    if (err == ENOENT && !required) return IniFile{};
    return absl::NotFoundError(absl::StrCat("AWS file ", path, " (named by ", named_by,
                                            ") cannot be read: ", std::strerror(err)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return ParseIni(path, text.str());
}

std::string Get(const Section* section, const char* key) {
  if (section == nullptr) return "";
  auto it = section->find(key);
  return it == section->end() ? "" : it->second;
}

// The credentials of `section` (from `path`), or nullopt when it has none.
absl::StatusOr<std::optional<S3Credentials>> SectionCredentials(const Section* section,
                                                                const std::string& path,
                                                                const std::string& profile) {
  S3Credentials c{Get(section, "aws_access_key_id"), Get(section, "aws_secret_access_key"),
                  Get(section, "aws_session_token")};
  if (c.access_key_id.empty() && c.secret_access_key.empty()) return std::nullopt;
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AWS file ", path, " profile [", profile, "] has ",
        c.access_key_id.empty()
            ? "aws_secret_access_key but no aws_access_key_id"
            : "aws_access_key_id " + c.access_key_id + " but no aws_secret_access_key"));
  }
  return c;
}

const Section* Find(const IniFile& ini, const std::string& name) {
  auto it = ini.find(name);
  return it == ini.end() ? nullptr : &it->second;
}

struct Files {
  std::string credentials_path;
  std::string config_path;
  IniFile credentials;
  IniFile config;
};

absl::StatusOr<Files> ReadFiles(const EnvLookup& env) {
  Files f;
  const std::string home = env("HOME").value_or("");
  std::optional<std::string> creds = env("AWS_SHARED_CREDENTIALS_FILE");
  std::optional<std::string> config = env("AWS_CONFIG_FILE");
  f.credentials_path = creds.value_or(home.empty() ? "" : home + "/.aws/credentials");
  f.config_path = config.value_or(home.empty() ? "" : home + "/.aws/config");
  if (!f.credentials_path.empty()) {
    CKPT_ASSIGN_OR_RETURN(f.credentials, ReadIni(f.credentials_path, creds.has_value(),
                                                 "AWS_SHARED_CREDENTIALS_FILE"));
  }
  if (!f.config_path.empty()) {
    CKPT_ASSIGN_OR_RETURN(f.config, ReadIni(f.config_path, config.has_value(), "AWS_CONFIG_FILE"));
  }
  return f;
}

// Credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, nullopt when neither is set.
absl::StatusOr<std::optional<S3Credentials>> EnvCredentials(const EnvLookup& env) {
  const std::string id = env("AWS_ACCESS_KEY_ID").value_or("");
  const std::string secret = env("AWS_SECRET_ACCESS_KEY").value_or("");
  if (id.empty() && secret.empty()) return std::nullopt;
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("AWS_ACCESS_KEY_ID is set (", id, ") but AWS_SECRET_ACCESS_KEY is not"));
  }
  if (id.empty()) {
    return absl::InvalidArgumentError("AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not");
  }
  return S3Credentials{id, secret, env("AWS_SESSION_TOKEN").value_or("")};
}

absl::Status FindCredentials(const EnvLookup& env, const Files& f, S3Settings* s) {
  CKPT_ASSIGN_OR_RETURN(std::optional<S3Credentials> from_env, EnvCredentials(env));
  if (from_env) {
    s->credentials = *std::move(from_env);
    s->credentials_source = "environment";
    return absl::OkStatus();
  }
  const std::string config_section = s->profile == "default" ? "default" : "profile " + s->profile;
  const Section* cred = Find(f.credentials, s->profile);
  const Section* conf = Find(f.config, config_section);
  for (auto [section, path] : {std::pair{cred, f.credentials_path}, {conf, f.config_path}}) {
    CKPT_ASSIGN_OR_RETURN(std::optional<S3Credentials> c,
                          SectionCredentials(section, path, s->profile));
    if (!c) continue;
    s->credentials = *std::move(c);
    s->credentials_source = absl::StrCat(path, " [", s->profile, "]");
    return absl::OkStatus();
  }
  const std::string where =
      absl::StrCat("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ",
                   f.credentials_path.empty() ? "(no HOME)" : f.credentials_path, " and ",
                   f.config_path.empty() ? "(no HOME)" : f.config_path);
  if (cred == nullptr && conf == nullptr && env("AWS_PROFILE").has_value()) {
    return absl::NotFoundError(
        absl::StrCat("AWS profile '", s->profile, "' (AWS_PROFILE) is in neither ", where));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no S3 credentials found for profile '", s->profile, "': searched ", where));
}

std::string FirstSet(const EnvLookup& env, std::initializer_list<const char*> names,
                     const std::string& fallback) {
  for (const char* name : names) {
    std::optional<std::string> v = env(name);
    if (v && !v->empty()) return *v;
  }
  return fallback;
}

}  // namespace

absl::StatusOr<S3Settings> LoadS3Settings(const EnvLookup& env) {
  S3Settings s;
  s.profile = FirstSet(env, {"AWS_PROFILE"}, "default");
  CKPT_ASSIGN_OR_RETURN(Files files, ReadFiles(env));
  CKPT_RETURN_IF_ERROR(FindCredentials(env, files, &s));
  const Section* conf =
      Find(files.config, s.profile == "default" ? "default" : "profile " + s.profile);
  std::string region = Get(conf, "region");
  s.region =
      FirstSet(env, {"AWS_REGION", "AWS_DEFAULT_REGION"}, region.empty() ? "us-east-1" : region);
  std::string endpoint = Get(conf, "endpoint_url");
  s.endpoint = FirstSet(
      env, {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"},
      endpoint.empty() ? absl::StrCat("https://s3.", s.region, ".amazonaws.com") : endpoint);
  return s;
}

absl::StatusOr<S3Settings> LoadS3SettingsFromEnvironment() {
  return LoadS3Settings([](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace ckpt
