// cobalt-trace v1: thousands of random mutations of a valid file open cleanly or fail with
// cobalt::Error, never anything else (run under ASan/UBSan in the debug preset).
#include "io/trace_fixtures.hpp"

namespace cobalt::io {
namespace {

using namespace test_support;  // NOLINT(build/namespaces): test helpers

// ---------------------------------------------------------------------------------------------------
// Fuzz: random mutations of a valid file either open cleanly or throw cobalt::Error.

TEST(TraceFuzz, MutationsNeverCrash) {
  TempDir dir;
  std::vector<RawTensor> tensors = small_tensors();
  tensors.push_back({"topk_weights", "F32", {kLayers, kTokens, 2}, std::string(96, '\x3f')});
  tensors.push_back({"layer_ids", "I32", {kLayers}, bytes_of(std::vector<int32_t>{0, 1})});
  Json meta = trace_meta();
  meta["num_sources"] = "3";
  const std::string base = build_file(meta, tensors);
  uint64_t base_header_len = 0;
  std::memcpy(&base_header_len, base.data(), 8);
  const std::string base_header = base.substr(8, base_header_len);
  const std::string base_data = base.substr(8 + base_header_len);

  const std::vector<std::pair<std::string, std::vector<std::string>>> edits = {
      {"I32", {"I16", "I64", "F32", "BF16", "U8"}},
      {"I64", {"I32", "I16"}},
      {"topk_ids", {"counts", "token_ids", "topk_idz", "layer_ids"}},
      {"step_offsets", {"source_rank", "counts", "topk_weights"}},
      {"source_rank", {"token_ids", "step_offsets"}},
      {"\"shape\"", {"\"shap\"", "\"dtype\""}},
      {"data_offsets", {"data_offset", "shape"}},
      {"__metadata__", {"__metadata_", "topk_ids"}},
      {"cobalt-trace", {"cobalt", ""}},
      {"{", {"[", "{{", ""}},
      {"]", {"}", ",]", ""}},
      {",", {"", ",,", ":"}},
  };
  const std::vector<std::string> numbers = {"0",
                                            "1",
                                            "2",
                                            "-1",
                                            "3",
                                            "7",
                                            "8",
                                            "9",
                                            "48",
                                            "96",
                                            "97",
                                            "1e3",
                                            "2.5",
                                            "4294967296",
                                            "9223372036854775807",
                                            "18446744073709551615",
                                            "99999999999999999999999"};

  std::mt19937_64 rng(20240531);
  const auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const std::string path = dir.file("fuzz.safetensors");
  int num_accepted = 0;
  int num_rejected = 0;
  constexpr int kIterations = 3000;
  for (int iter = 0; iter < kIterations; ++iter) {
    std::string bytes;
    std::string header = base_header;
    std::string data = base_data;
    const size_t op = pick(7);
    if (op == 4 || op == 5) {  // header text edits, length prefix kept consistent
      for (size_t n = 1 + pick(2); n > 0; --n) {
        if (op == 4) {  // replace a run of digits (a number) with another number
          std::vector<size_t> starts;
          for (size_t i = 0; i < header.size(); ++i) {
            if (std::isdigit(static_cast<unsigned char>(header[i])) &&
                (i == 0 || !std::isdigit(static_cast<unsigned char>(header[i - 1])))) {
              starts.push_back(i);
            }
          }
          const size_t begin = starts[pick(starts.size())];
          size_t end = begin;
          while (end < header.size() && std::isdigit(static_cast<unsigned char>(header[end])))
            ++end;
          header.replace(begin, end - begin, numbers[pick(numbers.size())]);
        } else {
          const auto& [from, tos] = edits[pick(edits.size())];
          const size_t at = header.find(from, pick(header.size()));
          const size_t where = at != std::string::npos ? at : header.find(from);
          if (where != std::string::npos) header.replace(where, from.size(), tos[pick(tos.size())]);
        }
      }
      bytes = raw_file(header, data);
    } else {
      bytes = raw_file(header, data);
      switch (op) {
        case 0:  // random bytes anywhere
          for (size_t n = 1 + pick(4); n > 0; --n)
            bytes[pick(bytes.size())] = static_cast<char>(rng());
          break;
        case 1:  // random bytes in the header text
          for (size_t n = 1 + pick(3); n > 0; --n) {
            bytes[8 + pick(header.size())] = static_cast<char>(rng());
          }
          break;
        case 2:  // truncation
          bytes.resize(pick(bytes.size()));
          break;
        case 3: {  // length prefix
          uint64_t len = base_header_len;
          const size_t how = pick(3);
          len = how == 0 ? rng() : how == 1 ? len + pick(16) - 8 : len ^ (uint64_t{1} << pick(64));
          std::memcpy(bytes.data(), &len, 8);
          break;
        }
        default: {  // small values written over the data section (ids, offsets, ranks)
          const size_t data_begin = 8 + header.size();
          for (size_t n = 1 + pick(2); n > 0; --n) {
            const size_t at = data_begin + 4 * pick(data.size() / 4);
            const int32_t value = static_cast<int32_t>(pick(12)) - 2;
            std::memcpy(bytes.data() + at, &value, 4);
          }
          break;
        }
      }
    }
    write_file(path, bytes);
    try {
      const TraceReader reader(path);
      touch_everything(reader);
      ++num_accepted;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      ++num_rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << iter << " (op " << op << "): non-cobalt exception "
                    << e.what();
    }
  }
  EXPECT_EQ(num_accepted + num_rejected, kIterations);
  EXPECT_GT(num_accepted, 50);
  EXPECT_GT(num_rejected, kIterations / 2);
}

}  // namespace
}  // namespace cobalt::io
