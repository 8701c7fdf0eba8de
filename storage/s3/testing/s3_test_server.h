// Test fixture: a real S3-compatible server (OpenStack Swift with s3api) for one test.
#ifndef CKPT_STORAGE_S3_TESTING_S3_TEST_SERVER_H_
#define CKPT_STORAGE_S3_TESTING_S3_TEST_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "storage/s3/s3_client.h"

namespace ckpt {

// A real one-node Swift with s3api on loopback, started in a fresh temp dir for one test.
// Runs storage/s3/testing/swift_server.py (Debian's python3-swift; tools/install_deps.sh
// installs it) under /usr/bin/python3. Path-style addressing, SigV4, region "us-east-1"; the
// access key and secret are generated per start. Not thread-safe: one test thread drives it.
class S3TestServer {
 public:
  // Starts swift_server.py start (found through the runfiles or the workspace; a data
  // dependency) within `timeout`; the error names the log dir.
  static absl::StatusOr<std::unique_ptr<S3TestServer>> Start(
      absl::Duration timeout = absl::Seconds(60));
  ~S3TestServer();  // stops every process and removes its temp dir

  // One server for a whole test binary, started on first use and kept to the process's end.
  // A start that fails is reported and aborts the binary: every test of it needs the server.
  static S3TestServer& Shared();
  // Shared(), with `bucket` made (once made, it stays: AlreadyExists is fine) and the AWS
  // environment pointing at it (ExportAwsEnvironment, each call). A failure aborts the binary.
  static S3TestServer& SharedWithBucket(const std::string& bucket);

  S3TestServer(const S3TestServer&) = delete;
  S3TestServer& operator=(const S3TestServer&) = delete;

  const std::string& endpoint() const { return endpoint_; }  // "http://127.0.0.1:PORT"
  const std::string& region() const { return region_; }      // "us-east-1"
  const std::string& access_key_id() const { return access_key_id_; }
  const std::string& secret_access_key() const { return secret_access_key_; }
  const std::string& log_dir() const { return log_dir_; }

  // S3Client options for this server's user (path-style, its endpoint and region).
  S3ClientOptions ClientOptions() const;
  // Points the standard AWS variables (key id, secret, region, endpoint; AWS_PROFILE unset) at
  // this server, so the "s3" store the registry makes from the environment finds it, and so do
  // the ckptctl processes a test runs, as a user's would.
  void ExportAwsEnvironment() const;

  absl::Status KillProxy();     // SIGKILL of the proxy only; requests then fail to connect
  absl::Status RestartProxy();  // the proxy back on the same port, data kept

  // SIGKILL of one of Swift's servers, "account", "container", "object" or "proxy"; the others
  // keep running. With the object server down the proxy answers S3 requests on objects with
  // 503 ServiceUnavailable (a 503 storm), until RestartServer("object").
  absl::Status KillServer(absl::string_view server);
  // The server back on its port and conf, data kept; returns once it and a signed ListBuckets
  // answer (the proxy uses it again at once: no error limiting).
  absl::Status RestartServer(absl::string_view server);

 private:
  S3TestServer() = default;

  std::string script_;  // swift_server.py
  std::string dir_;     // the temp dir this server owns (configs, data, logs)
  std::string endpoint_;
  std::string region_;
  std::string access_key_id_;
  std::string secret_access_key_;
  std::string log_dir_;
  bool keep_dir_ = false;  // a start that failed keeps its logs for the error it returned
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_S3_TESTING_S3_TEST_SERVER_H_
