// The dump loader: a good synthetic dump loads exactly; each kind of bad input gives a clear error.
#include <H5Cpp.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <vector>

#include "latentq/attention/attention.h"
#include "latentq/dump.h"
#include "latentq/probe_attention.h"
#include "latentq/util.h"
#include "synth_dump.h"

namespace {
using namespace latentq;
using lqtest::SynthData;
using lqtest::TempDir;
namespace fs = std::filesystem;

// Expects `f` to throw E whose message contains every string of `parts`.
template <class E, class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

struct DumpTest : ::testing::Test {
  TempDir dir;
  SynthData data = lqtest::make_synth();
  fs::path path = dir / "dump.h5";
  void SetUp() override { lqtest::write_synth(path, data); }
  std::string p() const { return path.string(); }
};

TEST_F(DumpTest, LoadsWhatWasWritten) {
  const Dump d = load_dump(path);
  EXPECT_EQ(d.attrs.model, "synthetic");
  EXPECT_EQ(d.attrs.source, "synthetic");
  EXPECT_EQ(d.attrs.revision, "seed-1234");
  EXPECT_EQ(d.attrs.rope_layout, "interleaved");
  EXPECT_EQ(d.attrs.original_dtype, "float32");
  EXPECT_EQ(d.attrs.config_json, "{}");
  EXPECT_EQ(d.attrs.num_layers, 3);
  EXPECT_EQ(d.attrs.num_heads, 2);
  EXPECT_EQ(d.attrs.kv_lora_rank, 16);
  EXPECT_EQ(d.attrs.qk_rope_head_dim, 8);
  EXPECT_EQ(d.attrs.qk_nope_head_dim, 4);
  EXPECT_EQ(d.attrs.v_head_dim, 4);
  EXPECT_EQ(d.attrs.softmax_scale, 0.125);
  EXPECT_EQ(d.num_tokens(), 64);
  EXPECT_EQ(d.num_seqs(), 2);
  EXPECT_EQ(d.seq_offsets, (std::vector<int64_t>{0, 40, 64}));
  EXPECT_EQ(d.tokens, data.tokens);
  EXPECT_EQ(d.positions, data.positions);
  EXPECT_EQ(d.file_layers, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(d.file_has_attention);
  ASSERT_EQ(d.layers.size(), 3u);
  for (int l = 0; l < 3; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const Layer& ly = d.layer(l);
    EXPECT_EQ(ly.index, l);
    EXPECT_EQ(ly.c_kv, data.c_kv[l]);
    EXPECT_EQ(ly.k_pe, data.k_pe[l]);
    EXPECT_TRUE(ly.has_attention());
    EXPECT_EQ(ly.num_query_rows(), 6);
    EXPECT_EQ(ly.q_rows, data.q_rows);
    EXPECT_EQ(ly.q_nope, data.q_nope[l]);
    EXPECT_EQ(ly.q_pe, data.q_pe[l]);
    EXPECT_EQ(ly.w_uk, data.w_uk[l]);
    EXPECT_EQ(ly.w_uv, data.w_uv[l]);
    EXPECT_EQ(ly.attn_out, data.attn_out[l]);
  }
  EXPECT_EQ(d.path, path);
}

TEST_F(DumpTest, LayerSubsetAndNoAttention) {
  LoadOptions o;
  o.layers = {2, 0};
  o.attention = false;
  const Dump d = load_dump(path, o);
  ASSERT_EQ(d.layers.size(), 2u);
  EXPECT_EQ(d.layers[0].index, 0);
  EXPECT_EQ(d.layers[1].index, 2);
  EXPECT_EQ(d.layers[1].c_kv, data.c_kv[2]);
  EXPECT_FALSE(d.layers[0].has_attention());
  EXPECT_TRUE(d.layers[0].q_nope.empty());
  EXPECT_TRUE(d.file_has_attention);
  EXPECT_EQ(d.file_layers, (std::vector<int>{0, 1, 2}));
  expect_error<std::invalid_argument>([&] { d.layer(1); }, {"layer 1 was not loaded"});
}

TEST(DumpLoad, LatentOnlyDump) {
  TempDir dir;
  lqtest::SynthSpec s;
  s.attention = false;
  lqtest::write_synth(dir / "d.h5", lqtest::make_synth(s));
  const Dump d = load_dump(dir / "d.h5");
  EXPECT_FALSE(d.file_has_attention);
  EXPECT_FALSE(d.layers[0].has_attention());
  EXPECT_EQ(d.layers.size(), 3u);
}

TEST_F(DumpTest, RequestedLayerMissing) {
  LoadOptions o;
  o.layers = {7};
  expect_error<std::invalid_argument>([&] { load_dump(path, o); }, {p(), "layer 7 was requested", "[0, 1, 2]"});
}

TEST(DumpLoad, MissingFile) {
  TempDir dir;
  const fs::path missing = dir / "nope.h5";
  expect_error<std::runtime_error>([&] { load_dump(missing); }, {missing.string(), "no such file"});
}

TEST(DumpLoad, NotHdf5) {
  TempDir dir;
  const fs::path f = dir / "text.h5";
  std::ofstream(f) << "this is not an HDF5 file\n";
  expect_error<std::runtime_error>([&] { load_dump(f); }, {f.string(), "not an HDF5 file"});
  expect_error<std::runtime_error>([&] { load_dump(dir.path()); }, {"is a directory"});
}

TEST_F(DumpTest, TruncatedFile) {
  const fs::path t = dir / "truncated.h5";
  fs::copy_file(path, t);
  const auto size = fs::file_size(t);
  fs::resize_file(t, size / 2);
  SCOPED_TRACE("truncated from " + std::to_string(size) + " bytes");
  expect_error<std::runtime_error>([&] { load_dump(t); }, {t.string(), "HDF5 error", "truncated or corrupt"});
}

TEST_F(DumpTest, WrongSchema) {
  lqtest::set_string_attr(path, "schema", "latentq-dump/0");
  expect_error<std::invalid_argument>([&] { load_dump(path); },
                                      {p(), "'schema' is \"latentq-dump/0\", expected \"latentq-dump/1\""});
}

// The cache families: each table row is found by its name and caches c_kv and k_pe; a dump without the attribute is
// dense MLA (no index_k held); an unknown family is refused naming the value and the table's names.
TEST_F(DumpTest, CacheFamilyFromTheTable) {
  for (const CacheFamilyTraits& f : kCacheFamilies) {
    SCOPED_TRACE(f.name);
    EXPECT_EQ(&cache_family_traits(f.name), &f);
    // an MLA family caches c_kv and k_pe, its indexer picks the keys; DeepSeek-V4 caches its entries instead
    EXPECT_EQ(f.holds(Target::CKV) && f.holds(Target::KPE), !f.compressed_entries);
    EXPECT_EQ(f.holds(Target::WindowKV) && f.holds(Target::CompressedKV), f.compressed_entries);
    if (!f.compressed_entries) EXPECT_EQ(f.topk_selection, f.holds(Target::IndexK));
  }
  const Dump d = load_dump(path);
  EXPECT_EQ(d.attrs.cache_family, "dense_mla");
  EXPECT_FALSE(d.attrs.family().topk_selection);
  EXPECT_EQ(d.attrs.index_head_dim, 0);
  EXPECT_TRUE(d.holds(0, Target::CKV));
  EXPECT_FALSE(d.holds(0, Target::IndexK));
  lqtest::set_string_attr(path, "cache_family", "deepseek_v5");
  expect_error<std::invalid_argument>(
      [&] { load_dump(path); },
      {p(), "root attribute unknown cache_family 'deepseek_v5', available: dense_mla, sparse_mla, deepseek_v4"});
}

TEST_F(DumpTest, MissingSchema) {
  lqtest::delete_attr(path, "schema");
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {p(), "missing root attribute 'schema'"});
}

TEST_F(DumpTest, MissingOrMistypedAttr) {
  lqtest::delete_attr(path, "kv_lora_rank");
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {p(), "missing root attribute 'kv_lora_rank'"});
  lqtest::set_string_attr(path, "kv_lora_rank", "16");
  expect_error<std::invalid_argument>([&] { load_dump(path); },
                                      {"'kv_lora_rank' has type string, expected an integer"});
}

// softmax_scale is a float64 attribute used by a float32 attention: checked after the conversion.
TEST_F(DumpTest, SoftmaxScaleMustBeANormalFloat32) {
  lqtest::set_double_attr(path, "softmax_scale", 1e300);  // finite as a double, inf as a float
  expect_error<std::invalid_argument>(
      [&] { load_dump(path); },
      {p() + ": root attribute 'softmax_scale' = 1e+300 is inf in float32 (largest finite 3.4028235e+38); the "
             "attention runs in float32: expected a value > 0 in the float32 normal range [1.1754944e-38, "
             "3.4028235e+38]"});
  lqtest::set_double_attr(path, "softmax_scale", 1e-50);  // 0 as a float: a uniform softmax
  expect_error<std::invalid_argument>([&] { load_dump(path); },
                                      {p() + ": root attribute 'softmax_scale' = 1e-50 becomes 0 in float32"});
  lqtest::set_double_attr(path, "softmax_scale", 1e-40);  // a subnormal float: the precision is lost
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {"'softmax_scale' = 1e-40 becomes 9.9999461e-41"});
  lqtest::set_double_attr(path, "softmax_scale", -0.125);
  expect_error<std::invalid_argument>([&] { load_dump(path); },
                                      {"'softmax_scale' = -0.125, expected a finite value > 0"});
  lqtest::set_double_attr(path, "softmax_scale", 0.1147214);  // DeepSeek-V2-Lite
  EXPECT_EQ(load_dump(path).attrs.softmax_scale, 0.1147214);
}

TEST_F(DumpTest, NumLayersDisagrees) {
  lqtest::set_int_attr(path, "num_layers", 4);
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {"/layers holds 3 layers", "num_layers = 4"});
}

TEST_F(DumpTest, MissingDataset) {
  lqtest::delete_link(path, "/layers/001/k_pe");
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {p(), "missing dataset /layers/001/k_pe"});
}

TEST_F(DumpTest, WrongDtype) {
  std::vector<double> v(data.c_kv[1].begin(), data.c_kv[1].end());
  lqtest::put_f64(path, "/layers/001/c_kv", {64, 16}, v);
  expect_error<std::invalid_argument>([&] { load_dump(path); },
                                      {p(), "/layers/001/c_kv has dtype float64, expected float32"});
}

TEST_F(DumpTest, WrongShape) {
  lqtest::put_f32(path, "/layers/001/c_kv", {64, 15}, std::vector<float>(64 * 15, 1.0f));
  expect_error<std::invalid_argument>(
      [&] { load_dump(path); },
      {p(), "/layers/001/c_kv has shape [64, 15], expected [64, 16] (T from /tokens, kv_lora_rank)"});
}

TEST_F(DumpTest, WrongRank) {
  lqtest::put_f32(path, "/layers/000/k_pe", {64 * 8}, std::vector<float>(64 * 8, 1.0f));
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {"/layers/000/k_pe has shape [512], expected [64, 8]"});
}

TEST_F(DumpTest, ShapesDifferAcrossLayers) {
  // Layer 002 has 5 query rows where layer 000 has 6.
  lqtest::put_i32(path, "/layers/002/q_rows", {5}, {1, 2, 3, 4, 5});
  expect_error<std::invalid_argument>([&] { load_dump(path); },
                                      {"/layers/002/q_rows has shape [5], expected [6] (Tq of layer 000)"});
}

TEST_F(DumpTest, NonFiniteLatents) {
  std::vector<float> c = data.c_kv[2];
  c[0] = std::numeric_limits<float>::quiet_NaN();
  c[17] = std::numeric_limits<float>::infinity();
  c[100] = -std::numeric_limits<float>::infinity();
  lqtest::put_f32(path, "/layers/002/c_kv", {64, 16}, c);
  expect_error<std::invalid_argument>([&] { load_dump(path); },
                                      {p(), "layer 002", "/layers/002/c_kv has 3 NaN/Inf values (of 1024)"});
  // Not loading layer 2 avoids the check.
  LoadOptions o;
  o.layers = {0, 1};
  EXPECT_NO_THROW(load_dump(path, o));
}

TEST_F(DumpTest, NonFiniteAttentionData) {
  std::vector<float> a = data.attn_out[0];
  a[3] = std::numeric_limits<float>::quiet_NaN();
  lqtest::put_f32(path, "/layers/000/attn_out", {6, 2, 4}, a);
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {"/layers/000/attn_out has 1 NaN/Inf values"});
  LoadOptions o;
  o.attention = false;
  EXPECT_NO_THROW(load_dump(path, o));
}

TEST_F(DumpTest, EmptyLayer) {
  lqtest::put_f32(path, "/layers/001/c_kv", {0, 16}, {});
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {p(), "layer 001 is empty", "(T = 0)"});
}

TEST(DumpLoad, NoTokens) {
  TempDir dir;
  const fs::path f = dir / "d.h5";
  lqtest::write_synth(f, lqtest::make_synth());
  lqtest::put_i32(f, "/tokens", {0}, {});
  expect_error<std::invalid_argument>([&] { load_dump(f); }, {"/tokens is empty (T = 0)"});
}

TEST_F(DumpTest, BadSeqOffsets) {
  const std::vector<std::vector<int64_t>> bad = {{0, 40, 30, 64}, {1, 64}, {0, 63}, {64}, {0, 70, 64}};
  for (const auto& o : bad) {
    SCOPED_TRACE(::testing::PrintToString(o));
    lqtest::put_i64(path, "/seq_offsets", {o.size()}, o);
    expect_error<std::invalid_argument>([&] { load_dump(path); }, {p(), "/seq_offsets must run from 0 to T = 64"});
  }
  lqtest::put_i32(path, "/seq_offsets", {3}, {0, 40, 64});
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {"/seq_offsets has dtype int32, expected int64"});
}

TEST_F(DumpTest, PartialAttentionData) {
  lqtest::delete_link(path, "/layers/001/w_uv");
  expect_error<std::invalid_argument>(
      [&] { load_dump(path); }, {"layer 001: attention datasets must be all present or all absent", "but not w_uv"});
}

TEST_F(DumpTest, AttentionInSomeLayersOnly) {
  for (const char* n : {"q_rows", "q_nope", "q_pe", "w_uk", "w_uv", "attn_out"})
    lqtest::delete_link(path, std::string("/layers/002/") + n);
  expect_error<std::invalid_argument>([&] { load_dump(path); },
                                      {"layer 000 has attention data but layer 002 has none"});
}

TEST_F(DumpTest, QueryRowOutOfRange) {
  lqtest::put_i32(path, "/layers/000/q_rows", {6}, {0, 1, 2, 3, 4, 64});
  expect_error<std::invalid_argument>([&] { load_dump(path); },
                                      {"/layers/000/q_rows[5] = 64 is not a token index in [0, 64)"});
}

TEST_F(DumpTest, BadLayerName) {
  lqtest::put_f32(path, "/layers/extra/c_kv", {1, 1}, {0.0f});
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {"/layers/extra is not a layer name"});
}

// Replaces root attribute `name` by variable-length strings on `space` (`values`, one per element).
void put_string_attr(const fs::path& path, const std::string& name, const H5::DataSpace& space,
                     const std::vector<const char*>& values) {
  H5::H5File f(path.string(), H5F_ACC_RDWR);
  if (f.attrExists(name)) f.removeAttr(name);
  const H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  const H5::Attribute a = f.createAttribute(name, t, space);
  if (!values.empty()) a.write(t, values.data());
}

// A string attribute holds one string. (An array of two variable-length strings was read into the
// storage of one, HDF5 writing the second pointer past it, and loaded as its first value; one of none,
// a null dataspace, freed an uninitialized pointer. Found by fuzz/fuzz_dump_schema.)
TEST_F(DumpTest, StringAttributeWithSeveralValues) {
  const hsize_t two = 2;
  for (const char* name : {"schema", "model"}) {
    SCOPED_TRACE(name);
    lqtest::write_synth(path, data);
    put_string_attr(path, name, H5::DataSpace(1, &two), {"latentq-dump/1", "latentq-dump/1"});
    expect_error<std::invalid_argument>([&] { load_dump(path); },
                                        {p(), fmt::format("root attribute '{}' holds 2 values, expected", name)});
    put_string_attr(path, name, H5::DataSpace(H5S_NULL), {});
    expect_error<std::invalid_argument>([&] { load_dump(path); },
                                        {p(), fmt::format("root attribute '{}' holds 0 values, expected", name)});
  }
}

// Replaces dataset `name` by a float32 [rows, cols] dataset (chunked by `chunk_rows` rows when > 0) of
// which only the first `written` rows are written (ones); HDF5 reads fill values for the rest.
void put_f32_written(const fs::path& path, const std::string& name, hsize_t rows, hsize_t cols, hsize_t chunk_rows,
                     hsize_t written) {
  H5::H5File f(path.string(), H5F_ACC_RDWR);
  H5Ldelete(f.getId(), name.c_str(), H5P_DEFAULT);
  const hsize_t dims[2] = {rows, cols};
  const H5::DataSpace sp(2, dims);
  H5::DSetCreatPropList cp;
  if (chunk_rows > 0) {
    const hsize_t chunk[2] = {chunk_rows, cols};
    cp.setChunk(2, chunk);
  }
  const H5::DataSet ds = f.createDataSet(name, H5::PredType::IEEE_F32LE, sp, cp);
  if (written == 0) return;
  const std::vector<float> ones(static_cast<size_t>(written * cols), 1.0f);
  H5::DataSpace fs = ds.getSpace();
  const hsize_t start[2] = {0, 0}, count[2] = {written, cols};
  fs.selectHyperslab(H5S_SELECT_SET, count, start);
  ds.write(ones.data(), H5::PredType::NATIVE_FLOAT, H5::DataSpace(2, count), fs);
}

// Every value of a dataset is stored in the file. (A dataset declared but not written, or written in
// part, loaded HDF5's fill values as data; a few bytes declaring 2^40 tokens asked for 4 TiB. Found by
// fuzz/fuzz_dump_schema, as an out-of-memory.)
TEST_F(DumpTest, DatasetNotWrittenInFull) {
  const std::string c = "/layers/001/c_kv";
  const hsize_t T = static_cast<hsize_t>(data.T), r = static_cast<hsize_t>(data.spec.kv_lora_rank);
  put_f32_written(path, c, T, r, 0, 0);  // contiguous, never written
  expect_error<std::invalid_argument>(
      [&] { load_dump(path); },
      {p(), fmt::format("{} has shape [{}, {}] ({} bytes) but 0 bytes of it are stored", c, T, r, T * r * 4),
       "not written in full"});
  put_f32_written(path, c, T, r, 16, 40);  // chunks of 16 rows: 3 of 4 written
  expect_error<std::invalid_argument>([&] { load_dump(path); },
                                      {p(), c + " has shape [64, 16] in 4 chunks, of which 3 are written"});
  put_f32_written(path, c, T, r, 16, T);  // all written: loads
  EXPECT_EQ(load_dump(path).layer(1).c_kv, std::vector<float>(T * r, 1.0f));

  H5::H5File(p(), H5F_ACC_RDWR).unlink("/tokens");
  {
    H5::H5File f(p(), H5F_ACC_RDWR);
    const hsize_t n = hsize_t{1} << 40;
    f.createDataSet("/tokens", H5::PredType::STD_I32LE, H5::DataSpace(1, &n));
  }
  expect_error<std::invalid_argument>(
      [&] { load_dump(path); }, {p(), "/tokens has shape [1099511627776] (4398046511104 bytes) but 0 bytes of it"});
}

TEST(Sha256, KnownDigests) {
  TempDir dir;
  std::ofstream(dir / "abc", std::ios::binary) << "abc";
  std::ofstream(dir / "empty", std::ios::binary).flush();
  EXPECT_EQ(file_sha256(dir / "abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(file_sha256(dir / "empty"), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // A file larger than one read chunk (1 MiB): 2^20 + 3 bytes of 'a' (digest from `head -c 1048579 /dev/zero
  // | tr '\0' a | sha256sum`).
  {
    std::ofstream f(dir / "big", std::ios::binary);
    const std::string chunk(1 << 20, 'a');
    f << chunk << "aaa";
  }
  EXPECT_EQ(file_sha256(dir / "big"), "f5e25b6b994188fdb721357d459785dc479934edfd40f95658a45ab2ce2d8027");
  EXPECT_THROW(file_sha256(dir / "missing"), std::runtime_error);
}

}  // namespace

// Sparse MLA: /layers/NNN/topk_offsets and topk_keys load with the layer, the attention the probes build from a
// layer (attention_queries) reads only those keys, and malformed selections are refused naming the dataset.
TEST_F(DumpTest, SparseSelectionLoadsAndTheAttentionReadsIt) {
  // Query row i reads its own token and every third key before it (key indices j of its window).
  const int64_t Tq = static_cast<int64_t>(data.q_rows.size());
  std::vector<int64_t> off{0};
  std::vector<int32_t> keys;
  for (int32_t t : data.q_rows) {
    const int64_t s0 = t < data.seq_offsets[1] ? 0 : data.seq_offsets[1];
    for (int64_t j = 0; j <= t - s0; ++j)
      if (j % 3 == 0 || j == t - s0) keys.push_back(static_cast<int32_t>(j));
    off.push_back(static_cast<int64_t>(keys.size()));
  }
  // attn_out of layer 1 recomputed sparse (float64), as a sparse model's dump holds it
  Dump whole = load_dump(path);
  Layer& l1 = whole.layers[1];
  l1.topk_offsets = off;
  l1.topk_keys = keys;
  const auto sparse = probes::absorbed_attention<double>(attention_queries(whole, l1), l1.c_kv, l1.k_pe);
  lqtest::put_i64(path, "/layers/001/topk_offsets", {off.size()}, off);
  lqtest::put_i32(path, "/layers/001/topk_keys", {keys.size()}, keys);
  lqtest::put_f32(path, "/layers/001/attn_out", {static_cast<hsize_t>(Tq), 2, 4},
                  std::vector<float>(sparse.out.begin(), sparse.out.end()));
  const Dump d = load_dump(path);
  EXPECT_FALSE(d.layers[0].sparse());
  ASSERT_TRUE(d.layers[1].sparse());
  EXPECT_EQ(d.layers[1].topk_offsets, off);
  EXPECT_EQ(d.layers[1].topk_keys, keys);
  const auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0, n = 0;
    for (size_t i = 0; i < a.size(); ++i) e += (a[i] - b[i]) * double(a[i] - b[i]), n += double(b[i]) * b[i];
    return std::sqrt(e / n);
  };
  const Layer& l = d.layers[1];
  const auto got = probes::absorbed_attention<float>(attention_queries(d, l), l.c_kv, l.k_pe);
  EXPECT_LT(rel(got.out, l.attn_out), 1e-5);  // the selection is read: dense attention is far off
  Layer dense = l;
  dense.topk_offsets.clear(), dense.topk_keys.clear();
  EXPECT_GT(rel(probes::absorbed_attention<float>(attention_queries(d, dense), l.c_kv, l.k_pe).out, l.attn_out), 1e-2);

  std::vector<int32_t> bad = keys;
  int64_t a = 0;  // the second key of the first row that selects two: repeat its first
  for (int64_t i = 0; i < Tq && a == 0; ++i)
    if (off[i + 1] - off[i] >= 2) a = off[i] + 1;
  ASSERT_GT(a, 0);
  bad[a] = bad[a - 1];
  lqtest::put_i32(path, "/layers/001/topk_keys", {bad.size()}, bad);
  expect_error<std::invalid_argument>(
      [&] { load_dump(path); },
      {fmt::format("layer 001: /layers/001/topk_keys[{}]", a), "expected strictly ascending keys"});
  lqtest::put_i32(path, "/layers/001/topk_keys", {keys.size() - 1}, std::vector<int32_t>(keys.begin(), keys.end() - 1));
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {"/layers/001/topk_offsets runs from 0 to"});
  lqtest::delete_link(path, "/layers/001/topk_keys");
  expect_error<std::invalid_argument>([&] { load_dump(path); }, {"must be both present or both absent"});
}
