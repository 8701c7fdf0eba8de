#include "storage/s3/s3_credentials.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSecret[] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYTOPSECRET";

// A fake HOME with .aws/ files, removed (its files only) at the end.
class AwsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/issue43_s3_credentials_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    home_ = tmpl;
    env_["HOME"] = home_;
  }
  void TearDown() override {
    for (const std::string& f : written_) std::remove(f.c_str());
    rmdir((home_ + "/.aws").c_str());
    rmdir(home_.c_str());
  }
  std::string Write(const std::string& name, const std::string& text) {
    mkdir((home_ + "/.aws").c_str(), 0700);
    const std::string path = home_ + "/.aws/" + name;
    std::ofstream(path) << text;
    written_.push_back(path);
    return path;
  }
  absl::StatusOr<S3Settings> Load() {
    return LoadS3Settings([this](const char* name) -> std::optional<std::string> {
      auto it = env_.find(name);
      if (it == env_.end()) return std::nullopt;
      return it->second;
    });
  }

  std::string home_;
  std::map<std::string, std::string> env_;
  std::vector<std::string> written_;
};

TEST_F(AwsFiles, EnvironmentVariablesWinOverFiles) {
  Write("credentials", "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = f\n");
  env_["AWS_ACCESS_KEY_ID"] = "ENVKEY";
  env_["AWS_SECRET_ACCESS_KEY"] = kSecret;
  env_["AWS_SESSION_TOKEN"] = "tok";
  env_["AWS_DEFAULT_REGION"] = "eu-west-1";
  env_["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9000";
  absl::StatusOr<S3Settings> s = Load();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->credentials.access_key_id, "ENVKEY");
  EXPECT_EQ(s->credentials.secret_access_key, kSecret);
  EXPECT_EQ(s->credentials.session_token, "tok");
  EXPECT_EQ(s->region, "eu-west-1");
  EXPECT_EQ(s->endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(s->credentials_source, "environment");
  env_["AWS_REGION"] = "ap-south-1";
  env_["AWS_ENDPOINT_URL_S3"] = "https://s3.example";
  s = Load();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->region, "ap-south-1");
  EXPECT_EQ(s->endpoint, "https://s3.example");
}

TEST_F(AwsFiles, ReadsTheProfileFromCredentialsAndConfigFiles) {
  Write("credentials",
        "# comment\n[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = d\n\n"
        "[train]\naws_access_key_id=TRAINKEY\naws_secret_access_key=" +
            std::string(kSecret) + "\naws_session_token = t2\n");
  Write("config",
        "[default]\nregion = us-west-2\n[profile train]\nregion = eu-central-1\n"
        "endpoint_url = http://minio:9000\ns3 =\n  addressing_style = path\n");
  absl::StatusOr<S3Settings> s = Load();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->credentials.access_key_id, "DEFKEY");
  EXPECT_EQ(s->region, "us-west-2");
  EXPECT_EQ(s->endpoint, "https://s3.us-west-2.amazonaws.com");
  env_["AWS_PROFILE"] = "train";
  s = Load();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->credentials.access_key_id, "TRAINKEY");
  EXPECT_EQ(s->credentials.secret_access_key, kSecret);
  EXPECT_EQ(s->credentials.session_token, "t2");
  EXPECT_EQ(s->region, "eu-central-1");
  EXPECT_EQ(s->endpoint, "http://minio:9000");
  EXPECT_THAT(s->credentials_source, HasSubstr("credentials [train]"));
}

TEST_F(AwsFiles, CredentialsInTheConfigFileAndFilesNamedByVariables) {
  const std::string config =
      Write("other_config", "[profile p]\naws_access_key_id = CFGKEY\naws_secret_access_key = c\n");
  env_["AWS_CONFIG_FILE"] = config;
  env_["AWS_SHARED_CREDENTIALS_FILE"] = Write("other_creds", "[q]\n");
  env_["AWS_PROFILE"] = "p";
  absl::StatusOr<S3Settings> s = Load();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->credentials.access_key_id, "CFGKEY");
  EXPECT_EQ(s->region, "us-east-1");
}

// Every error path, each with the secret somewhere in the input: no message holds it.
TEST_F(AwsFiles, NoErrorMessageContainsTheSecret) {
  const std::string s(kSecret);
  struct Case {
    std::map<std::string, std::string> env;
    std::string credentials;  // file text, or "" for no file
    absl::StatusCode code;
    const char* says;
  };
  const Case cases[] = {
      {{{"AWS_SECRET_ACCESS_KEY", s}},
       "",
       absl::StatusCode::kInvalidArgument,
       "AWS_ACCESS_KEY_ID is not"},
      {{{"AWS_ACCESS_KEY_ID", "AKIDONLY"}}, "", absl::StatusCode::kInvalidArgument, "AKIDONLY"},
      {{},
       "[default]\naws_secret_access_key = " + s + "\n",
       absl::StatusCode::kInvalidArgument,
       "no aws_access_key_id"},
      {{},
       "[default]\naws_access_key_id = AKIDF\n",
       absl::StatusCode::kInvalidArgument,
       "AKIDF but no aws_secret_access_key"},
      {{},
       "[default]\naws_secret_access_key " + s + "\n",
       absl::StatusCode::kInvalidArgument,
       "line 2: expected 'key = value'"},
      {{}, "[default " + s + "\n", absl::StatusCode::kInvalidArgument, "line 1"},
      {{},
       "aws_secret_access_key = " + s + "\n[default]\n",
       absl::StatusCode::kInvalidArgument,
       "before any [section]"},
      {{{"AWS_PROFILE", "nope"}},
       "[default]\naws_access_key_id = A\naws_secret_access_key = " + s + "\n",
       absl::StatusCode::kNotFound,
       "profile 'nope'"},
      {{{"AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/issue43"},
        {"AWS_ACCESS_KEY_ID", "AKIDENV"},
        {"AWS_SECRET_ACCESS_KEY", s}},
       "",
       absl::StatusCode::kNotFound,
       "AWS_SHARED_CREDENTIALS_FILE"},
      {{}, "", absl::StatusCode::kFailedPrecondition, "no S3 credentials found"},
  };
  for (const Case& c : cases) {
    env_ = c.env;
    env_["HOME"] = home_;
    if (!c.credentials.empty()) Write("credentials", c.credentials);
    absl::StatusOr<S3Settings> got = Load();
    if (!c.credentials.empty()) std::remove((home_ + "/.aws/credentials").c_str());
    ASSERT_FALSE(got.ok()) << c.says;
    EXPECT_EQ(got.status().code(), c.code) << got.status();
    EXPECT_THAT(got.status().message(), HasSubstr(c.says));
    EXPECT_THAT(got.status().ToString(), Not(HasSubstr(kSecret)));
    EXPECT_THAT(got.status().ToString(), Not(HasSubstr("PSECRET")));
  }
}

}  // namespace
}  // namespace ckpt
