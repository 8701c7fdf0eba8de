// S3 credentials, region and endpoint from the standard AWS environment variables and the
// shared ~/.aws/credentials and ~/.aws/config files. No error message ever holds a secret.
#ifndef CKPT_STORAGE_S3_S3_CREDENTIALS_H_
#define CKPT_STORAGE_S3_S3_CREDENTIALS_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt {

// An access key pair with an optional session token (temporary credentials).
struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;  // never logged, never in a Status
  std::string session_token;      // empty when none
};

// Where and as whom to reach S3, as the AWS CLI and SDKs would find it.
struct S3Settings {
  S3Credentials credentials;
  std::string region;              // "us-east-1" when nothing names one
  std::string endpoint;            // "https://s3.<region>.amazonaws.com" when nothing names one
  std::string profile;             // the profile read ("default" unless AWS_PROFILE names one)
  std::string credentials_source;  // e.g. "environment" or "/home/u/.aws/credentials [p]"
};

// Returns a variable's value, or nullopt when it is not set (std::getenv in production).
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// Finds the settings in the AWS order:
// - credentials: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), else the
//   profile's aws_access_key_id/aws_secret_access_key/aws_session_token in the credentials
//   file (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials, section [profile]), else in the
//   config file (AWS_CONFIG_FILE or ~/.aws/config, section [profile name], [default]);
// - region: AWS_REGION, AWS_DEFAULT_REGION, the config file's `region`, "us-east-1";
// - endpoint: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the config file's `endpoint_url`, AWS's.
// FailedPrecondition naming the places searched when no credentials are found;
// InvalidArgument naming the variable, or the file and line, for malformed input. A missing
// file is skipped unless a variable named it (then NotFound naming the variable and path).
absl::StatusOr<S3Settings> LoadS3Settings(const EnvLookup& env);

// LoadS3Settings over the process environment.
absl::StatusOr<S3Settings> LoadS3SettingsFromEnvironment();

}  // namespace ckpt

#endif  // CKPT_STORAGE_S3_S3_CREDENTIALS_H_
