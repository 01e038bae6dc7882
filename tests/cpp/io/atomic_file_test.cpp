#include "cobalt/io/atomic_file.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "cobalt/core/error.hpp"
#include "testing/cli.hpp"

namespace cobalt::io {
namespace {

namespace fs = std::filesystem;

// Exit statuses of run_unprivileged's child when it cannot run fn as intended.
constexpr int kCannotDropRoot = 100, kCannotReachDir = 101;

// Runs fn in a child process whose file permissions apply (as nobody when this process is root,
// which would write a 0444 file anyway) and that can create files in `dir`; its result is the
// child's exit status.
int run_unprivileged(const fs::path& dir, const std::function<int()>& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      ::_exit(kCannotDropRoot);
    }
    if (::access(dir.c_str(), W_OK | X_OK) != 0) ::_exit(kCannotReachDir);
    ::_exit(fn());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Renaming over a file needs only the directory's permission: a file whose own permissions refuse
// writing is refused (IoError naming it) and stays as it was; a writable one beside it is replaced.
TEST(AtomicFile, AFileItsPermissionsProtectIsNotReplaced) {
  // /tmp when there is one: TMPDIR may name a directory that nobody cannot enter.
  const fs::path tmp = fs::is_directory("/tmp") ? fs::path("/tmp") : fs::temp_directory_path();
  const fs::path dir = tmp / ("cobalt_atomic_file_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::all);  // anyone may create and rename files here
  const fs::path protected_file = dir / "read_only.json", open_file = dir / "writable.json";
  std::ofstream(protected_file) << "old";
  std::ofstream(open_file) << "old";
  fs::permissions(protected_file,
                  fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  fs::permissions(open_file, fs::perms::all);
  const auto write_as_unprivileged = [&](const fs::path& path) {
    return run_unprivileged(dir, [&] {
      try {
        write_file_atomically(path.string(), "new", "--out");
        return 0;
      } catch (const IoError& e) {
        const bool named = std::string(e.what()).find("is not writable") != std::string::npos;
        return named && e.os_errno() == EACCES ? 3 : 4;
      } catch (...) {
        return 5;
      }
    });
  };
  const int status = write_as_unprivileged(protected_file);
  if (status == kCannotDropRoot || status == kCannotReachDir) {
    fs::remove_all(dir);
    GTEST_SKIP() << (status == kCannotDropRoot ? "cannot switch to user nobody"
                                               : "user nobody cannot reach " + dir.string());
  }
  EXPECT_EQ(status, 3);
  EXPECT_EQ(testing::read_file(protected_file), "old");
  EXPECT_EQ(write_as_unprivileged(open_file), 0);
  EXPECT_EQ(testing::read_file(open_file), "new");
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_NE(entry.path().filename().string().rfind(".cobalt-", 0), 0u)
        << "temporary file left behind: " << entry.path();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cobalt::io
