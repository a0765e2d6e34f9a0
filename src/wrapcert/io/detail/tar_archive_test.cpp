#include <wrapcert/error.h>
#include <wrapcert/io/checkpoint_file.h>
#include <wrapcert/io/detail/tar_archive.h>
#include <wrapcert/io/torch_save.h>
#include <wrapcert/state_dict.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/temp_dir.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace wrapcert {
namespace {

using test_support::ThrowsError;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Member {
  std::string name;
  std::string data;
  char type = '0';  ///< '0' a file, '2' a symbolic link (data: its target), '5' a folder
};

/// A POSIX ustar archive as tar(1) and Python's tarfile write it: a 512-byte header per member
/// (its checksum computed), the data padded to 512 bytes, two zero blocks at the end.
std::string ustar(const std::vector<Member>& members) {
  std::string out;
  for (const auto& m : members) {
    std::string h(512, '\0');
    auto put = [&h](size_t at, const std::string& s) { h.replace(at, s.size(), s); };
    auto octal = [&put](size_t at, size_t width, uint64_t v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%0*llo", static_cast<int>(width - 1),
                    static_cast<unsigned long long>(v));
      put(at, buf);
    };
    const bool file = m.type == '0';
    put(0, m.name);
    octal(100, 8, m.type == '5' ? 0755 : 0644);
    octal(108, 8, 0);
    octal(116, 8, 0);
    octal(124, 12, file ? m.data.size() : 0);
    octal(136, 12, 1700000000);
    h[156] = m.type;
    if (m.type == '2') put(157, m.data);
    put(257, std::string("ustar\0"
                         "00",
                         8));
    put(148, "        ");
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    char check[8];
    std::snprintf(check, sizeof check, "%06o", sum);
    h.replace(148, 7, check, 7);
    out += h;
    if (file) {
      out += m.data;
      out.append((512 - m.data.size() % 512) % 512, '\0');
    }
  }
  out.append(1024, '\0');
  return out;
}

std::string write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

/// The bytes of a `torch.save` file of a two-key state dict, its keys under `prefix`.
std::string saved_state(const test_support::TempDir& dir, const std::string& prefix) {
  StateDict state;
  state.insert(prefix + "w", torch::arange(6, torch::kFloat).reshape({2, 3}));
  state.insert(prefix + "b", torch::ones({3}));
  save_torch_save(dir / "state.pt", state);
  std::ifstream in(dir / "state.pt", std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(TarArchive, ListsEveryMemberWithItsHeaderByte) {
  test_support::TempDir dir;
  const auto path = write(dir / "a.nemo", ustar({{"./", "", '5'},
                                                 {"./model_config.yaml", "a: 1\n"},
                                                 {"./sub/x.bin", std::string(600, 'x')},
                                                 {"./link", "model_config.yaml", '2'}}));
  const auto tar = detail::list_tar(path);
  ASSERT_EQ(tar.members.size(), 4u);
  EXPECT_FALSE(tar.gzip);
  EXPECT_TRUE(tar.members[0].folder);
  EXPECT_EQ(tar.members[1].path, "model_config.yaml");
  EXPECT_TRUE(tar.members[1].regular);
  EXPECT_EQ(tar.members[1].header, 512);
  EXPECT_EQ(tar.members[2].size, 600u);
  EXPECT_EQ(tar.members[2].header, 512 * 3);
  EXPECT_FALSE(tar.members[3].regular);
  EXPECT_TRUE(detail::looks_like_tar(path));
}

TEST(TarArchive, MembersOutsideTheFolderAreNamedWithTheirByte) {
  test_support::TempDir dir;
  const auto up = write(dir / "up.tar", ustar({{"./a", "x"}, {"../../etc/x", "y"}}));
  EXPECT_THAT([&] { detail::list_tar(up); },
              ThrowsError(ErrorCode::kMalformedInput, "",
                          AllOf(HasSubstr("'../../etc/x' (the header at byte 1024)"),
                                HasSubstr("outside the archive's folder"))));
  const auto link = write(dir / "link.tar", ustar({{"./a/l", "../../x", '2'}}));
  EXPECT_THAT([&] { detail::list_tar(link); },
              ThrowsError(ErrorCode::kMalformedInput, "", HasSubstr("leads outside")));
  // A link that stays inside is kept.
  const auto inside = write(dir / "in.tar", ustar({{"./a/l", "../b", '2'}}));
  EXPECT_EQ(detail::list_tar(inside).members.size(), 1u);
  const auto twice = write(dir / "twice.tar", ustar({{"./a", "x"}, {"a", "y"}}));
  EXPECT_THAT([&] { detail::list_tar(twice); },
              ThrowsError(ErrorCode::kMalformedInput, "", HasSubstr("stored twice")));
}

TEST(TarArchive, TruncatedOrCorruptArchivesAreDamage) {
  test_support::TempDir dir;
  const auto whole = ustar({{"./a", std::string(5000, 'a')}, {"./b", "b"}});
  const auto cut = write(dir / "cut.tar", whole.substr(0, 2048));
  EXPECT_THAT([&] { detail::list_tar(cut); },
              ThrowsError(ErrorCode::kMalformedInput, "", HasSubstr(cut)));
  auto bad = whole;
  bad[150] ^= 1;  // the first header's checksum
  const auto corrupt = write(dir / "corrupt.tar", bad);
  EXPECT_THAT([&] { detail::list_tar(corrupt); },
              ThrowsError(ErrorCode::kMalformedInput, "", HasSubstr("damaged tar archive")));
}

TEST(TarArchive, RewriteReplacesOneMemberAndKeepsTheOthers) {
  test_support::TempDir dir;
  const auto path = write(dir / "a.tar", ustar({{"./", "", '5'},
                                                {"./config.yaml", "a: 1\n"},
                                                {"./weights", "old"},
                                                {"./tok", std::string(1000, 't')},
                                                {"./ln", "tok", '2'}}));
  write(dir / "new", "the new weights, longer than the old ones");
  {
    std::ofstream out(dir / "b.tar", std::ios::binary);
    detail::rewrite_tar_member(path, "./weights", dir / "new", out);
  }
  const auto tar = detail::list_tar(dir / "b.tar");
  std::vector<std::string> names;
  for (const auto& m : tar.members) names.push_back(m.name);
  EXPECT_THAT(names, ElementsAre("./", "./config.yaml", "./weights", "./tok", "./ln"));
  auto member = [&](const std::string& name) {
    std::ostringstream out;
    detail::extract_tar_member(dir / "b.tar", name, out);
    return out.str();
  };
  EXPECT_EQ(member("./weights"), "the new weights, longer than the old ones");
  EXPECT_EQ(member("./config.yaml"), "a: 1\n");
  EXPECT_EQ(member("./tok"), std::string(1000, 't'));
  EXPECT_FALSE(tar.members[4].regular);
  std::ostringstream ignored;
  EXPECT_THAT([&] { detail::rewrite_tar_member(path, "./absent", dir / "new", ignored); },
              ThrowsError(ErrorCode::kMalformedInput, "", HasSubstr("no member './absent'")));
}

TEST(TarArchive, NemoWeightsAreReadAndFixedInsideTheArchive) {
  test_support::TempDir dir;
  const auto path =
      write(dir / "m.nemo", ustar({{"./", "", '5'},
                                   {"./model_config.yaml", "a: 1\n"},
                                   {"./model_weights.ckpt", saved_state(dir, "module.")}}));
  const auto c = read_checkpoint(path, {false, ""});
  EXPECT_EQ(c.archive, path);
  EXPECT_EQ(c.archive_member, "./model_weights.ckpt");
  EXPECT_EQ(c.format, "torch.save zip");
  EXPECT_THAT(keys(c.state), ElementsAre("module.w", "module.b"));
  EXPECT_THAT(c.not_read, ElementsAre("model_config.yaml"));
  EXPECT_THAT(c.files(), ElementsAre(path));
  EXPECT_EQ(format_for(dir / "fixed.nemo"), CheckpointFormat::kArchive);
  write_fixed_checkpoint(dir / "fixed.nemo", c, {{"module.w", "w"}, {"module.b", "b"}});
  const auto fixed = read_checkpoint(dir / "fixed.nemo");
  EXPECT_THAT(keys(fixed.state), ElementsAre("w", "b"));
  EXPECT_TRUE(torch::equal(fixed.state["w"], torch::arange(6, torch::kFloat).reshape({2, 3})));
  std::ostringstream config;
  detail::extract_tar_member(dir / "fixed.nemo", "./model_config.yaml", config);
  EXPECT_EQ(config.str(), "a: 1\n");
  // Not an archive's fix: refused by name before anything is written.
  const auto plain = read_checkpoint(dir / "state.pt", {false, ""});
  EXPECT_THAT([&] { planned_files(dir / "x.nemo", plain); },
              ThrowsError(ErrorCode::kInvalidArgument, dir / "x.nemo",
                          HasSubstr("only as the fix of one")));
}

TEST(TarArchive, TarsWithoutWeightsAreNamedWithWhatTheyHold) {
  test_support::TempDir dir;
  const auto old =
      write(dir / "old.pt",
            ustar({{"sys_info", "x"}, {"pickle", "x"}, {"tensors", "x"}, {"storages", "x"}}));
  EXPECT_THAT([&] { read_checkpoint(old); },
              ThrowsError(ErrorCode::kUnsupported, "", HasSubstr("tar torch.save format")));
  const auto config = write(dir / "c.nemo", ustar({{"./model_config.yaml", "a: 1\n"}}));
  EXPECT_THAT(
      [&] { read_checkpoint(config); },
      ThrowsError(ErrorCode::kUnsupported, "",
                  AllOf(HasSubstr("no model_weights.ckpt"), HasSubstr("model_config.yaml"))));
  const auto damaged = write(dir / "d.nemo", ustar({{"./model_weights.ckpt", "PK\3\4 cut"}}));
  EXPECT_THAT([&] { read_checkpoint(damaged); },
              ThrowsError(ErrorCode::kMalformedInput, "",
                          AllOf(HasSubstr(damaged + " (member ./model_weights.ckpt)"),
                                ::testing::Not(HasSubstr("/proc/self")))));
}

}  // namespace
}  // namespace wrapcert
