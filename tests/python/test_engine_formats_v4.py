"""DeepSeek-V4's entry records (kPresets sglang-dsv4-mxfp4, sglang-dsv4-int4, b12x-dsv4-nvfp4) and their formats
(mxfp4-rn, int4-sym-g32-e4m3), by hand: blocks whose bytes are worked out below, checked against both the
engine references (engine_refs_v4) and the C++ module. test_engine_formats.py runs the same presets and formats
byte for byte on random and adversarial rows (test_cpp_pack_record_matches_reference,
test_cpp_quantize_matches_reference)."""

import numpy as np

import engine_refs as R
import engine_refs_v4 as R4
import latentq
import latentq._core  # noqa: F401  (the compiled module: its absence is an error, not a skip)


def _bf16(x):
    """float32 rows rounded to bf16 (the engines' entry dtype), as float32."""
    return (R.bf16_bits(np.asarray(x, np.float32)).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _record(preset, ckv, kpe):
    _, _, _, s_ckv, s_kpe, _ = R.RECORDS[preset]
    q_ckv = latentq.quantize(np.ascontiguousarray(ckv), s_ckv, "c_kv")
    q_kpe = latentq.quantize(np.ascontiguousarray(kpe), s_kpe, "k_pe")
    return np.asarray(latentq.pack_record(q_ckv, q_kpe, preset))


def test_sglang_mx_round_byte_is_exact_on_half_amax():
    """The MXFP4 kernel rounds log2(amax) - log2(6) in float32 (tl.math.log2); latentq decides in exact math. For
    every positive finite bf16 and fp16 amax the two bytes agree, and log2(amax / 6) + 1/2 lies at least 1e-4 from
    an integer (the float32 expression's rounding error is below 2e-5 at |log2| <= 140), so any float32 log2 of a
    few ulps gives the same byte. A float32 amax can lie closer: 4.2426405 (3·√2 = 4.24264069) is 2e-7 from it."""
    bf16 = (np.arange(1, 0x7F80, dtype=np.uint32) << np.uint32(16)).view(np.float32)
    fp16 = np.arange(1, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)
    for amax in (bf16, fp16):
        np.testing.assert_array_equal(R4.sglang_mx_round_byte_engine(amax), R4.sglang_mx_round_byte_exact(amax))
        v = np.log2(np.maximum(amax, R4.SGLANG_MX_AMAX_FLOOR).astype(np.float64) / 6.0) + 0.5
        assert np.abs(v - np.round(v)).min() > 1e-4
    tie = np.float32(3 * np.sqrt(2))
    v = np.log2(np.float64(tie) / 6.0) + 0.5
    assert abs(v) < 1e-6, (tie, v)


def test_mxfp4_rn_by_hand():
    """Three groups of 32 where SGLang's round-to-nearest scale differs from OCP's floor and SGLang's ceil.
    Group 0 = (4.21875, -0.0, 0.75, 1.25, 0...): 4.21875 = 1.0546875·4, significand below 3·√2/4 = 1.0607, so
    round(log2(4.21875 / 6)) = round(-0.508) = -1, byte 126, scale 1/2 (floor: 2 - 2 = 0, byte 127; ceil:
    ceil(-0.508) = 0, byte 127); x/s = 8.4375 saturates (code 7), -0 keeps its sign (0x8), 0.75 / 0.5 = 1.5 (code 3),
    1.25 / 0.5 = 2.5 (a tie at 2 vs 3: RNE code 4). Group 1 = (4.25, 0.375, 0...): 1.0625 >= 1.0607, round(-0.497) =
    0, byte 127; 4.25 lands on 4 (code 6), 0.375 is the tie 0.25 | 0.5 (RNE: 0.5, code 1, byte 0x16). Group 2 = 0:
    the byte clamps at 0 (scale 2^-127), codes 0."""
    x = np.zeros((1, 96), np.float32)
    x[0, [0, 1, 2, 3, 32, 33]] = [4.21875, -0.0, 0.75, 1.25, 4.25, 0.375]
    for q in (R4.sglang_mxfp4_rn(x), latentq.quantize(x, "mxfp4-rn", "c_kv")):
        codes, scales = np.asarray(q.codes).view(np.uint8), np.asarray(q.scales).astype(np.uint8)
        np.testing.assert_array_equal(scales.reshape(-1), [126, 127, 0])
        np.testing.assert_array_equal(codes[0, [0, 1, 16, 17, 32]], [0x87, 0x43, 0x16, 0x00, 0x00])
    np.testing.assert_array_equal(np.asarray(latentq.quantize(x, "mxfp4", "c_kv").scales)[:2], [127, 127])
    np.testing.assert_array_equal(np.asarray(latentq.quantize(x, "mxfp4-ceil", "c_kv").scales)[:2], [127, 127])


def test_int4_sym_g32_e4m3_by_hand():
    """SGLang's Direct INT4 rule by hand. Group 0 = (7, 2.5, -3.5, 0.5, -0.4, 0...): step e4m3(7/7) = 1 (0x38); codes
    7, round-half-even 2, -4 (nibble 0xC), 0, -0 -> 0: bytes 0x27, 0x0C, 0x00. Group 1 = (1, -1, 0...): 1/7 =
    1.1428·2^-3, e4m3 1.125·2^-3 = 0.140625 (0x21); 1 / 0.140625 = 7.11 -> 7, -7 (nibble 9): byte 0x97. Group 2 = 0:
    step 0, codes 0. Decode: code · step (-4 · 1 = -4; 7 · 0.140625 = 0.984375)."""
    x = np.zeros((1, 96), np.float32)
    x[0, [0, 1, 2, 3, 4, 32, 33]] = [7.0, 2.5, -3.5, 0.5, -0.4, 1.0, -1.0]
    for q in (R4.sglang_int4_e4m3(x), latentq.quantize(x, "int4-sym-g32-e4m3", "c_kv")):
        codes, scales = np.asarray(q.codes).view(np.uint8), np.asarray(q.scales).astype(np.uint8)
        np.testing.assert_array_equal(scales.reshape(-1), [0x38, 0x21, 0x00])
        np.testing.assert_array_equal(codes[0, [0, 1, 2, 16]], [0x27, 0x0C, 0x00, 0x97])
        assert not codes[0, 32:].any()
    y = np.asarray(latentq.dequantize(latentq.quantize(x, "int4-sym-g32-e4m3", "c_kv")))
    np.testing.assert_array_equal(y[0, [0, 1, 2, 32, 33]], [7.0, 2.0, -4.0, 0.984375, -0.984375])


def test_sglang_368_records_by_hand():
    """Both SGLang records: [0, 224) codes, [224, 238) the 14 scale bytes, [238, 240) zero, [240, 368) bf16 rope.
    Entry: NoPE group g = (g + 1) at column 32 g, rope column j = j - 32 (bf16-exact). MXFP4: byte of g + 1 is
    round(log2((g + 1) / 6)) + 127 (g = 0: log2(1/6) = -2.58 -> -3, byte 124; g = 5: log2 1 = 0, byte 127); the
    element (g + 1) / s is 8, 8, 6, 8, 5, 6 for g < 6: codes 7, 7, 7, 7, 6 (5: the tie 4 | 6, RNE 4), 7. INT4:
    step e4m3((g + 1) / 7), code round((g + 1) / step)."""
    ckv = np.zeros((1, 448), np.float32)
    ckv[0, 0::32] = np.arange(1, 15, dtype=np.float32)
    kpe = np.arange(-32, 32, dtype=np.float32)[None, :]
    rope = R._le_bytes(R.bf16_bits(kpe), "<u2")
    for preset in ("sglang-dsv4-mxfp4", "sglang-dsv4-int4"):
        ref, rec = R.RECORDS[preset][0](ckv, kpe), _record(preset, ckv, kpe)
        assert rec.shape == ref.shape == (1, 368)
        np.testing.assert_array_equal(rec, ref, err_msg=preset)
        assert not rec[0, 238:240].any()
        np.testing.assert_array_equal(rec[:, 240:], rope)
    mx = _record("sglang-dsv4-mxfp4", ckv, kpe)
    np.testing.assert_array_equal(mx[0, 224:230], [124, 125, 126, 126, 127, 127])
    np.testing.assert_array_equal(mx[0, [0, 16, 32, 48, 64, 80]] & 0xF, [7, 7, 7, 7, 6, 7])
    i4 = _record("sglang-dsv4-int4", ckv, kpe)
    step = R.e4m3_value(i4[0, 224:238])
    np.testing.assert_array_equal(i4[0, 224:238], R.e4m3_bits(np.arange(1, 15, dtype=np.float32) / np.float32(7)))
    np.testing.assert_array_equal(i4[0, 0:224:16] & 0xF, np.clip(np.round(np.arange(1, 15) / step), -7, 7))


def test_b12x_dsv4_nvfp4_record_by_hand():
    """The 432 B record quantizes all 512 entry columns (RoPE included) and stores the RoPE again as bf16: [0, 224)
    NoPE codes, [224, 256) RoPE codes, [256, 284) NoPE scales, [284, 288) RoPE scales, [288, 304) zero, [304, 432)
    bf16 RoPE. Rope group 0 = (6, -3, 0...): scale e4m3(6 · fl(1/6)) = 1 (0x38), codes 7, 0xD: byte 0xD7. A NoPE group
    of amax 0.001 has scale e4m3(0.001/6) = 0 (below 2^-10): the kernel's 1/0 = inf saturates its 0.001 to 6 (code 7),
    latentq's -rcp stores code 0 there, so that row is not among b12x_dsv4_nvfp4_exact_rows."""
    ckv = _bf16(np.random.default_rng(0).standard_normal((2, 448)))
    kpe = np.ones((2, 64), np.float32)
    kpe[:, :16] = 0
    kpe[:, :2] = [6.0, -3.0]
    ckv[1, :16] = 0
    ckv[1, 0] = _bf16([0.001])[0]
    ref, rec = R4.b12x_dsv4_nvfp4_record(ckv, kpe), _record("b12x-dsv4-nvfp4", ckv, kpe)
    assert rec.shape == ref.shape == (2, 432)
    np.testing.assert_array_equal(R4.b12x_dsv4_nvfp4_exact_rows(ckv, kpe), [True, False])
    np.testing.assert_array_equal(rec[0], ref[0])
    assert rec[0, 224] == 0xD7 and rec[0, 284] == 0x38 and not rec[:, 288:304].any()
    np.testing.assert_array_equal(rec[:, 304:], R._le_bytes(R.bf16_bits(kpe), "<u2"))
    q = R.fp4_tile16_e4m3_flashinfer(ckv)
    np.testing.assert_array_equal(rec[:, :224], q.codes)
    np.testing.assert_array_equal(rec[:, 256:284], q.scales.reshape(2, 28))
    assert rec[1, 256] == ref[1, 256] == 0 and (ref[1, 0] & 0xF) == 7 and (rec[1, 0] & 0xF) == 0


def test_trtllm_dsv4_nvfp4_cold_record_by_hand():
    """TensorRT-LLM's cold-page entry at the identity global scale: the -rcp format's codes and scales of the 448
    NoPE columns, then the 64 RoPE columns as bf16 (380 B). Group 0 = (6, 3, -1.5, 0.5): scale 0x38, bytes 0x57,
    0x1B. Row 1's group 0 = (0.001, 0...): amax/6 rounds to the e4m3 scale 0, and the kernel's `vecMax != 0` takes
    1/0 = inf (code 7), latentq's -rcp 0 (code 0): not an exact row. An all-zero group (amax 0) is 0 in both."""
    ckv = _bf16(np.random.default_rng(1).standard_normal((2, 448)))
    ckv[:, :16] = 0
    ckv[0, :4] = [6.0, 3.0, -1.5, 0.5]
    ckv[1, 0] = _bf16([0.001])[0]
    kpe = _bf16(np.random.default_rng(2).standard_normal((2, 64)))
    ref, rec = R4.trtllm_dsv4_nvfp4_cold_record(ckv, kpe), _record("trtllm-dsv4-nvfp4-cold", ckv, kpe)
    assert rec.shape == ref.shape == (2, 380)
    np.testing.assert_array_equal(R4.trtllm_dsv4_nvfp4_cold_exact_rows(ckv, kpe), [True, False])
    np.testing.assert_array_equal(rec[0], ref[0])
    assert rec[0, 0] == 0x57 and rec[0, 1] == 0x1B and rec[0, 224] == 0x38
    np.testing.assert_array_equal(rec[:, 252:], R._le_bytes(R.bf16_bits(kpe), "<u2"))
    assert rec[1, 224] == ref[1, 224] == 0 and (ref[1, 0] & 0xF) == 7 and (rec[1, 0] & 0xF) == 0
    np.testing.assert_array_equal(rec[1, 1:], ref[1, 1:])


def test_vllm_v4_indexer_fp8_is_the_amaxfloor_row_on_bf16_keys():
    """vLLM's DeepSeek-V4 compressor writes the CSA indexer keys with amax · fl(1/448) where the V3.2 kernel (the
    vllm-dsa-indexer-fp8 row, fp8-e4m3-tile128-pow2-amaxfloor) divides by 448. fl(1/448) = (1/448)(1 + 4.5e-8): on
    every bf16 amax the two exponents agree (448 · 2^k gives exactly 2^k either way), so on V4's bf16 keys the row
    stores vLLM's V4 bytes: 2000 keys of magnitudes 1e-6 to 1e3 (some below the 1e-4 floor, some 448 · 2^k), codes
    and scales byte for byte."""
    bf16 = (np.arange(1, 0x7F80, dtype=np.uint32) << np.uint32(16)).view(np.float32)
    a = np.maximum(bf16, np.float32(1e-4))
    np.testing.assert_array_equal(
        R4._ceil_log2_f32((a * R4.VLLM_V4_INV_FP8_MAX).astype(np.float32)),
        R4._ceil_log2_f32((a / np.float32(448)).astype(np.float32)),
    )
    rng = np.random.default_rng(7)
    k = rng.standard_normal((2000, 128)) * 10.0 ** rng.uniform(-6, 3, (2000, 1))
    k[:20, 0] = 448.0 * 2.0 ** np.arange(-10, 10)  # amax exactly 448 · 2^k
    k[:20, 1:] = np.clip(k[:20, 1:], -1.0, 1.0) * 2.0 ** np.arange(-10, 10)[:, None]
    k = _bf16(k.astype(np.float32))
    codes, scales = R4.vllm_v4_indexer_fp8(k)
    q = latentq.quantize(np.ascontiguousarray(k), "fp8-e4m3-tile128-pow2-amaxfloor", "index_k")
    np.testing.assert_array_equal(np.asarray(q.codes).view(np.uint8), codes)
    np.testing.assert_array_equal(
        np.asarray(q.scales, np.float32).reshape(-1, 1).view(np.uint32), scales.view(np.uint32)
    )
    assert (np.abs(k).max(axis=1) < 1e-4).any() and (scales == 1.0).any()
