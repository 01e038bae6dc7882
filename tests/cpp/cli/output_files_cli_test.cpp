// Output files of the CLI: never the input trace, never a FIFO or device replaced, written
// completely or not at all, symlinks followed; stdout write errors fail the command.
#include <sys/stat.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "testing/cli.hpp"

namespace cobalt::testing {
namespace {

using OutputFilesCli = CliTest;

constexpr const char* kGen = "trace gen --preset uniform --steps 2 --tokens-per-step 64";

TEST_F(OutputFilesCli, RefusesToOverwriteTheInputTrace) {
  ASSERT_EQ(run(std::string(kGen) + " --out '" + path("t.st") + "'").exit_code, 0);
  const std::string before = read_file(path("t.st"));
  for (const std::string flags : {"--json", "--report"}) {
    const auto r = run("simulate --trace '" + path("t.st") + "' --cluster 2x2 --policies static " +
                       flags + " '" + path("t.st") + "'");
    EXPECT_EQ(r.exit_code, 2) << flags << r.err;
    EXPECT_NE(r.err.find("is the input trace"), std::string::npos) << r.err;
  }
  const auto plan =
      run("plan --trace '" + path("t.st") + "' --cluster 2x2 --out '" + path("t.st") + "'");
  EXPECT_EQ(plan.exit_code, 2) << plan.err;
  EXPECT_EQ(read_file(path("t.st")), before);
}

// FIFOs and character devices are written in place (never replaced by a regular file);
// directories are refused; links are followed and kept; a replaced file keeps its mode.
TEST_F(OutputFilesCli, WritesDevicesInPlaceAndFollowsLinks) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  // A reader on the FIFO (opening it for writing waits for one).
  const auto fifo = run_shell("cat '" + path("fifo") + "' > '" + path("from_fifo.st") + "' & '" +
                                  std::string(COBALT_CLI_PATH) + "' " + kGen + " --out '" +
                                  path("fifo") + "'; wait",
                              dir_);
  EXPECT_EQ(fifo.exit_code, 0) << fifo.err;
  EXPECT_TRUE(std::filesystem::is_fifo(path("fifo")));
  EXPECT_GT(std::filesystem::file_size(path("from_fifo.st")), 100u);
  if (std::filesystem::is_character_file("/dev/null")) {
    EXPECT_EQ(run(std::string(kGen) + " --out /dev/null").exit_code, 0);
    EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
  }
  const auto json_out =
      run("simulate --preset uniform --steps 2 --tokens-per-step 64 --cluster 2x2 "
          "--policies static --json /dev/stdout");
  EXPECT_EQ(json_out.exit_code, 0) << json_out.err;
  EXPECT_NE(json_out.out.find("\"best_policy\""), std::string::npos);
  const auto directory =
      run("plan --preset uniform --cluster 2x4 --steps 2 --tokens-per-step 64 "
          "--out '" +
          dir_.string() + "'");
  EXPECT_EQ(directory.exit_code, 2) << directory.err;
  EXPECT_NE(directory.err.find("is a directory"), std::string::npos) << directory.err;
  // A dangling link: the file it names is written, the link stays a link.
  std::filesystem::create_symlink("target.st", dir_ / "link.st");
  ASSERT_EQ(run(std::string(kGen) + " --out '" + path("link.st") + "'").exit_code, 0);
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / "link.st"));
  EXPECT_TRUE(std::filesystem::is_regular_file(dir_ / "target.st"));
  // Replacing keeps the file's permission bits.
  std::filesystem::permissions(
      dir_ / "target.st", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  ASSERT_EQ(run(std::string(kGen) + " --seed 5 --out '" + path("link.st") + "'").exit_code, 0);
  EXPECT_EQ(std::filesystem::status(dir_ / "target.st").permissions(),
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

// `--json /dev/stdout` with stdout redirected to a file: the JSON goes into the stream after the
// table (replacing the file would have cut the table off).
TEST_F(OutputFilesCli, JsonToRedirectedStdoutKeepsTheStream) {
  const auto r =
      run("simulate --preset uniform --steps 2 --tokens-per-step 64 --cluster 2x2 "
          "--policies static --json /dev/stdout");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("modelled time per step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"best_policy\""), std::string::npos) << r.out;
}

TEST_F(OutputFilesCli, LinkIntoAMissingDirectoryIsRefusedBeforeTheRun) {
  std::filesystem::create_symlink("missing/x.json", dir_ / "link.json");
  const auto r = run("plan --preset uniform --cluster 2x4 --steps 2 --tokens-per-step 64 --out '" +
                     path("link.json") + "'");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("whose directory does not exist"), std::string::npos) << r.err;
}

TEST_F(OutputFilesCli, AFailedWriteKeepsTheOldFile) {
  const std::string plan = "plan --preset uniform --cluster 2x4 --steps 2 --tokens-per-step 256 ";
  ASSERT_EQ(run(plan + "--out '" + path("p.json") + "'").exit_code, 0);
  const std::string before = read_file(path("p.json"));
  ASSERT_GT(before.size(), 1024u);
  EXPECT_NE(before.find("\"within_cap\""),
            std::string::npos);  // the heuristic says if it met the cap
  // A file size limit of one block (512 bytes in dash, 1 KiB in bash): the write fails part-way.
  const auto r = run_shell("ulimit -f 1; trap '' XFSZ; '" + std::string(COBALT_CLI_PATH) + "' " +
                               plan + "--seed 3 --out '" + path("p.json") + "'",
                           dir_);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  // An I/O failure, not an "invalid argument".
  EXPECT_NE(r.err.find("cobalt: I/O error: --out: cannot write"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(path("p.json")), before);
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_NE(entry.path().filename().string().rfind(".cobalt-", 0), 0u)
        << "temporary file left behind: " << entry.path();
  }
}

// An existing output file whose permissions refuse writing (0444) is refused before the run, as a
// shell redirection refuses it, instead of being replaced by a rename (which needs only the
// directory's permission). Run as nobody when the tests run as root (root may write any file).
TEST_F(OutputFilesCli, AReadOnlyOutputFileIsRefusedNotReplaced) {
  std::string as_user;
  if (::geteuid() == 0) {
    if (!std::filesystem::exists("/usr/bin/setpriv")) GTEST_SKIP() << "no setpriv to drop root";
    as_user = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups ";
    // The build may live where nobody cannot reach it (a checkout under /root), and so may the
    // scratch directory (TMPDIR).
    if (run_shell(as_user + "'" + std::string(COBALT_CLI_PATH) + "' --version", dir_).exit_code !=
        0)
      GTEST_SKIP() << "nobody cannot run " << COBALT_CLI_PATH;
    std::filesystem::permissions(dir_, std::filesystem::perms::all);
    if (run_shell(as_user + "test -w '" + dir_.string() + "'", dir_).exit_code != 0)
      GTEST_SKIP() << "nobody cannot write in " << dir_;
  }
  std::filesystem::permissions(dir_, std::filesystem::perms::all);
  write("ro.json", "old");
  std::filesystem::permissions(dir_ / "ro.json", std::filesystem::perms::owner_read |
                                                     std::filesystem::perms::group_read |
                                                     std::filesystem::perms::others_read);
  const auto r = run_shell(as_user + "'" + std::string(COBALT_CLI_PATH) +
                               "' plan --preset uniform --cluster 2x4 --steps 2 "
                               "--tokens-per-step 64 --out '" +
                               path("ro.json") + "'",
                           dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("ro.json: the file is not writable"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(path("ro.json")), "old");
}

// Error messages go to stderr; when it is closed or full the exit status still says what
// happened (a failed write of the message threw inside the error handler and aborted).
TEST_F(OutputFilesCli, AClosedOrFullStderrDoesNotAbort) {
  const std::string cli = "'" + std::string(COBALT_CLI_PATH) + "'";
  for (const std::string redirect : {"2>&-", "2>/dev/full"}) {
    if (redirect == "2>/dev/full" && !std::filesystem::exists("/dev/full")) continue;
    const auto missing = run_shell("(" + cli + " trace info '" + path("missing.st") + "' " +
                                       redirect + "; echo \"status $?\")",
                                   dir_);
    EXPECT_NE(missing.out.find("status 1"), std::string::npos) << redirect << ": " << missing.out;
    const auto usage =
        run_shell("(" + cli + " no-such-command " + redirect + "; echo \"status $?\")", dir_);
    EXPECT_NE(usage.out.find("status 2"), std::string::npos) << redirect << ": " << usage.out;
  }
}

// A file name that is not UTF-8 ends up in the JSON as U+FFFD instead of failing the run at the
// end.
TEST_F(OutputFilesCli, NonUtf8FileNamesInJson) {
  const std::string name = path(
      "bad\xff"
      "name.st");
  ASSERT_EQ(run(std::string(kGen) + " --out '" + name + "'").exit_code, 0);
  const auto info = run("trace info --json '" + name + "'");
  EXPECT_EQ(info.exit_code, 0) << info.err;
  const auto sim = run("simulate --trace '" + name + "' --cluster 2x2 --policies static --json '" +
                       path("o.json") + "'");
  ASSERT_EQ(sim.exit_code, 0) << sim.err;
  const auto j = nlohmann::json::parse(read_file(path("o.json")));
  EXPECT_NE(j.at("scenario").at("workload").get<std::string>().find("\xEF\xBF\xBD"),
            std::string::npos);
}

TEST_F(OutputFilesCli, StdoutWriteErrorsFail) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const auto r = run_shell(
      "('" + std::string(COBALT_CLI_PATH) + "' trace gen --list-presets > /dev/full)", dir_);
  EXPECT_EQ(r.exit_code, 1);
}

}  // namespace
}  // namespace cobalt::testing
