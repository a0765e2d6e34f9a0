#include <wrapcert/error.h>
#include <wrapcert/io/detail/atomic_file.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/temp_dir.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace wrapcert {
namespace {

namespace fs = std::filesystem;
using test_support::ThrowsError;

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override { file_ = (dir_ / "report.json").string(); }

  static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  size_t entries() const {
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  }

  test_support::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  std::string file_;
};

TEST_F(AtomicFile, ReplacesTheFileAndLeavesNothingBeside) {
  write_file_atomically(file_, "old");
  write_file_atomically(file_, "new contents");
  EXPECT_EQ(read(file_), "new contents");
  EXPECT_EQ(entries(), 1u);
}

TEST_F(AtomicFile, KeepsThePermissionsOfTheFileItReplaces) {
  write_file_atomically(file_, "old");
  fs::permissions(file_, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  write_file_atomically(file_, "new");
  EXPECT_EQ(fs::status(file_).permissions(),
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
}

TEST_F(AtomicFile, AWriterThatThrowsLeavesTheOldFileAndNoTemporary) {
  write_file_atomically(file_, "old");
  EXPECT_THROW(write_file_atomically(file_,
                                     [](std::ostream& out) {
                                       out << "half of the new";
                                       throw std::runtime_error("interrupted");
                                     }),
               std::runtime_error);
  EXPECT_EQ(read(file_), "old");
  EXPECT_EQ(entries(), 1u);
}

TEST_F(AtomicFile, AnUnwritableDestinationIsAnErrorNamingIt) {
  const auto missing = (dir_ / "no-such-folder" / "report.json").string();
  EXPECT_THAT([&] { write_file_atomically(missing, "x"); },
              ThrowsError(ErrorCode::kInvalidArgument, missing,
                          ::testing::HasSubstr("cannot open its folder")));
  fs::create_directories(dir_ / "a-folder");
  EXPECT_THROW(write_file_atomically((dir_ / "a-folder").string(), "x"), Error);
  EXPECT_TRUE(fs::is_directory(dir_ / "a-folder"));
}

/// Runs `write` in a child process and returns how it ended.
template <typename F>
int in_child(F write) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    write();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// The kernel kills the writer mid-write: RLIMIT_FSIZE turns the write past 64 KiB into SIGXFSZ.
TEST_F(AtomicFile, ARunKilledMidWriteLeavesTheOldFileWhole) {
  const std::string old(100000, 'o');  // larger than the limit: only new writes are limited
  write_file_atomically(file_, old);
  const int status = in_child([this] {
    constexpr rlim_t kLimit = rlim_t{64} * 1024;
    struct rlimit limit {
      kLimit, kLimit
    };
    ::setrlimit(RLIMIT_FSIZE, &limit);
    write_file_atomically(file_, std::string(1 << 20, 'n'));
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer was not interrupted (status " << status << ")";
  EXPECT_EQ(WTERMSIG(status), SIGXFSZ);
  EXPECT_EQ(read(file_), old);
  EXPECT_EQ(entries(), 1u) << "the unnamed file went away with the process";
}

// SIGKILL from outside while the writer is between two chunks of a large file.
TEST_F(AtomicFile, ARunKilledBySigkillMidWriteLeavesTheOldFileWhole) {
  write_file_atomically(file_, "old");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    write_file_atomically(file_, [&](std::ostream& out) {
      const std::string chunk(1 << 16, 'n');
      for (int i = 0;; ++i) {
        out << chunk;
        if (i == 4) {
          out.flush();
          (void)!::write(ready[1], "w", 1);  // part of the file is on disk: kill me now
        }
      }
    });
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(read(file_), "old");
  EXPECT_EQ(entries(), 1u);
}

}  // namespace
}  // namespace wrapcert
