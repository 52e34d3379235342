//===- SafetensorsTest.cpp - safetensors parsing, writing, token files ----===//
//
// Weight and token files come from outside; each malformed variant must be
// rejected with a message rather than read out of bounds.
//
//===----------------------------------------------------------------------===//

#include "error.h"
#include "init.h"
#include "safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <unistd.h>
#include <vector>

using namespace megac_rt;

namespace {

std::vector<uint8_t> image(const std::string &Header, size_t DataBytes) {
  std::vector<uint8_t> B(8 + Header.size() + DataBytes, 0);
  uint64_t N = Header.size();
  std::memcpy(B.data(), &N, 8);
  std::memcpy(B.data() + 8, Header.data(), Header.size());
  return B;
}

std::string parseError(const std::vector<uint8_t> &B) {
  try {
    parseSafetensors(B.data(), B.size());
  } catch (const std::exception &E) {
    return E.what();
  }
  return "";
}

std::string tmpPath(const std::string &Name) {
  return ::testing::TempDir() + "megac_rt_" + std::to_string(::getpid()) +
         "_" + Name;
}

TEST(Safetensors, ParsesValidHeader) {
  auto B = image(R"({"__metadata__":{"format":"pt"},)"
                 R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                 R"("b":{"dtype":"BF16","shape":[],"data_offsets":[24,26]}})",
                 26);
  SafetensorsHeader H = parseSafetensors(B.data(), B.size());
  ASSERT_EQ(H.tensors.size(), 2u);
  const TensorInfo *A = H.find("a");
  ASSERT_NE(A, nullptr);
  EXPECT_EQ(A->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(A->numel(), 6u);
  EXPECT_EQ(H.find("b")->numel(), 1u);
  EXPECT_EQ(H.find("__metadata__"), nullptr);
}

TEST(Safetensors, RejectsBadHeaderLength) {
  EXPECT_NE(parseError({1, 2, 3}).find("need at least 8"), std::string::npos);
  auto B = image("{}", 0);
  B[0] = 200; // claims 200 bytes of header in a 10-byte file
  EXPECT_NE(parseError(B).find("runs past the end"), std::string::npos);
  B[0] = 0;
  B[5] = 1; // 2^40 bytes
  EXPECT_NE(parseError(B).find("100 MB"), std::string::npos);
}

TEST(Safetensors, RejectsOffsetsOutOfRange) {
  auto B = image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                 8);
  EXPECT_NE(parseError(B).find("outside the 8-byte data section"),
            std::string::npos);
  auto C = image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})",
                 8);
  EXPECT_NE(parseError(C).find("outside"), std::string::npos);
}

TEST(Safetensors, RejectsWrongSize) {
  auto B = image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                 8);
  EXPECT_NE(parseError(B).find("holds 8 bytes but dtype F32"),
            std::string::npos);
}

TEST(Safetensors, RejectsNonObjectAndBadJson) {
  EXPECT_NE(parseError(image("[1,2]", 0)).find("not a JSON object"),
            std::string::npos);
  EXPECT_NE(parseError(image("{\"a\":", 0)).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(parseError(image(R"({"a":{"dtype":"Q7","shape":[],)"
                             R"("data_offsets":[0,0]}})",
                             0))
                .find("unknown dtype"),
            std::string::npos);
  EXPECT_NE(parseError(image(R"({"a":{"dtype":"F32","shape":[-1],)"
                             R"("data_offsets":[0,0]}})",
                             0))
                .find("non-negative"),
            std::string::npos);
}

TEST(Safetensors, WriteReadRoundTripAndSliceLoad) {
  std::string Path = tmpPath("rt.safetensors");
  std::vector<float> W(12);
  for (int I = 0; I < 12; ++I)
    W[size_t(I)] = float(I);
  std::vector<int32_t> Tok = {1, 2, 3};
  writeSafetensors(Path,
                   {{"transformer.w", "F32", {3, 4}, W.data(), 48},
                    {"tokens", "I32", {1, 3}, Tok.data(), 12}},
                   {{"producer", "test"}});
  {
    WeightFiles F(Path);
    ASSERT_NE(F.find("tokens").tensor, nullptr);
    EXPECT_EQ(SafetensorsFile(Path).header().dataStart % 8, 0u);
    // Parameter "w_part" = columns [2,4) of rows [1,3) of a [3,2] view
    // starting at hf_offset [0,2] of tensor "w": the global param is
    // [3,2], the local slice [2,2] at offset [1,0].
    std::vector<float> Out(4);
    loadParamSlice(F, "w_part", "w", {0, 2}, {3, 2}, {1, 0}, {2, 2},
                   Out.data());
    EXPECT_EQ(Out, (std::vector<float>{6, 7, 10, 11}));
    try {
      loadParamSlice(F, "w_part", "w", {0, 3}, {3, 2}, {0, 0}, {3, 2},
                     Out.data());
      FAIL() << "expected an error";
    } catch (const RunError &E) {
      EXPECT_NE(std::string(E.what()).find("has shape [3,4] but parameter "
                                           "w_part expects [3,2] at offset "
                                           "[0,3]"),
                std::string::npos);
    }
    // A parameter that is the tensor itself takes it whole, never a corner.
    try {
      loadParamSlice(F, "w", "w", {0, 0}, {3, 2}, {0, 0}, {3, 2}, Out.data());
      FAIL() << "expected an error";
    } catch (const RunError &E) {
      EXPECT_NE(std::string(E.what()).find("has shape [3,4] but parameter w "
                                           "is [3,2]: the weights are "
                                           "another model's"),
                std::string::npos);
    }
    // A padded vocabulary: the parameter has 5 rows, the tensor 3 (its
    // hf_shape); the slice of rows [2,5) takes row 2 and two zero rows.
    std::vector<float> Padded(12, -1.0f);
    loadParamSlice(F, "w", "w", {0, 0}, {5, 4}, {2, 0}, {3, 4}, Padded.data(),
                   {3, 4});
    EXPECT_EQ(Padded, (std::vector<float>{8, 9, 10, 11, 0, 0, 0, 0, 0, 0, 0,
                                          0}));
    std::vector<float> PadOnly(4, -1.0f); // rows [4,5): padding alone
    loadParamSlice(F, "w", "w", {0, 0}, {5, 4}, {4, 0}, {1, 4}, PadOnly.data(),
                   {3, 4});
    EXPECT_EQ(PadOnly, (std::vector<float>(4, 0.0f)));
    try {
      loadParamSlice(F, "x", "missing", {0}, {1}, {0}, {1}, Out.data());
      FAIL() << "expected an error";
    } catch (const RunError &E) {
      EXPECT_NE(std::string(E.what()).find("tensor \"missing\""),
                std::string::npos);
    }
  }
  std::remove(Path.c_str());
}

TEST(Safetensors, HalfConversions) {
  EXPECT_EQ(halfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(halfToFloat(0xC000), -2.0f);
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(halfToFloat(0x7C00)));
  EXPECT_EQ(bf16ToFloat(0x3F80), 1.0f);
}

TEST(Safetensors, FirstNonFiniteScansEveryBlock) {
  // Values at each edge of the scan's 4096-value blocks, and past them.
  std::vector<float> V(3 * 4096 + 7, 1.0f);
  EXPECT_EQ(firstNonFinite(V.data(), V.size()), -1);
  EXPECT_EQ(firstNonFinite(V.data(), 0), -1);
  for (size_t At :
       {size_t(0), size_t(4095), size_t(4096), size_t(8191), V.size() - 1}) {
    std::vector<float> W = V;
    W[At] = std::nanf("");
    EXPECT_EQ(firstNonFinite(W.data(), W.size()), int64_t(At));
    W[At] = -INFINITY;
    EXPECT_EQ(firstNonFinite(W.data(), W.size()), int64_t(At));
    EXPECT_STREQ(nonFiniteName(W[At]), "-inf");
    // The first of two, and nothing before the count.
    W[V.size() - 1] = INFINITY;
    EXPECT_EQ(firstNonFinite(W.data(), W.size()), int64_t(At));
    EXPECT_EQ(firstNonFinite(W.data(), At), -1);
  }
  // The largest finite float and the subnormals are finite.
  V[5] = 3.4028235e38f;
  V[6] = 1e-45f;
  EXPECT_EQ(firstNonFinite(V.data(), V.size()), -1);
  EXPECT_STREQ(nonFiniteName(std::nanf("")), "nan");
  EXPECT_STREQ(nonFiniteName(INFINITY), "inf");
}

TEST(TokenFile, RawAndLlmcFormats) {
  std::string Raw = tmpPath("raw.bin"), Llmc = tmpPath("llmc.bin");
  {
    std::ofstream F(Raw, std::ios::binary);
    uint16_t T[5] = {1, 2, 3, 4, 60000};
    F.write(reinterpret_cast<char *>(T), sizeof(T));
  }
  EXPECT_EQ(readTokenFile(Raw, 4, 10), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_THROW(readTokenFile(Raw, 6, 10), RunError);
  try {
    readTokenFile(Raw, 5, 10);
    FAIL();
  } catch (const RunError &E) {
    EXPECT_NE(std::string(E.what()).find("token 60000 at position 4"),
              std::string::npos);
  }
  {
    std::ofstream F(Llmc, std::ios::binary);
    int32_t Hdr[256] = {20240520, 1, 3};
    uint16_t T[3] = {7, 8, 9};
    F.write(reinterpret_cast<char *>(Hdr), sizeof(Hdr));
    F.write(reinterpret_cast<char *>(T), sizeof(T));
  }
  EXPECT_EQ(readTokenFile(Llmc, 3, 10), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_THROW(readTokenFile(Llmc, 4, 10), RunError);
  std::remove(Raw.c_str());
  std::remove(Llmc.c_str());
}

/// Writes a Megatron indexed dataset at \p Prefix: uint16 sequences
/// \p Seqs, stored in the .bin at the byte offsets \p Pointers.
void writeMegatron(const std::string &Prefix,
                   const std::vector<std::vector<uint16_t>> &Seqs,
                   const std::vector<int64_t> &Pointers, size_t BinBytes) {
  std::vector<uint8_t> Bin(BinBytes);
  for (size_t K = 0; K < Seqs.size(); ++K)
    std::memcpy(Bin.data() + Pointers[K], Seqs[K].data(), Seqs[K].size() * 2);
  std::ofstream(Prefix + ".bin", std::ios::binary)
      .write(reinterpret_cast<const char *>(Bin.data()),
             std::streamsize(Bin.size()));
  std::ofstream I(Prefix + ".idx", std::ios::binary);
  const char Magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  const uint64_t Version = 1, NSeq = Seqs.size(), NDoc = 1;
  const uint8_t Code = 8; // uint16
  I.write(Magic, 9);
  I.write(reinterpret_cast<const char *>(&Version), 8);
  I.write(reinterpret_cast<const char *>(&Code), 1);
  I.write(reinterpret_cast<const char *>(&NSeq), 8);
  I.write(reinterpret_cast<const char *>(&NDoc), 8);
  for (const auto &S : Seqs) {
    const int32_t N = int32_t(S.size());
    I.write(reinterpret_cast<const char *>(&N), 4);
  }
  I.write(reinterpret_cast<const char *>(Pointers.data()),
          std::streamsize(Pointers.size() * 8));
  const int64_t Doc = 0;
  I.write(reinterpret_cast<const char *>(&Doc), 8);
}

// A token file read where used gives the tokens the decoded one holds, in
// index order where the sequences lie out of order in the .bin (two runs:
// 1 and 2 lie back to back), also in a window across the runs, and its
// fingerprint is the CRC of those tokens as int32s.
TEST(TokenFile, ReadWhereUsedMatchesDecoded) {
  const std::string Prefix = tmpPath("read-where-used");
  // Sequence 0 at byte 20, 1 at byte 0, 2 at byte 8 (after 1).
  writeMegatron(Prefix, {{5, 6, 7}, {1, 2, 3, 4}, {8, 9}}, {20, 0, 8}, 26);
  const std::vector<int32_t> Want = {5, 6, 7, 1, 2, 3, 4, 8, 9};
  EXPECT_EQ(readTokenFile(Prefix, 9, 10), Want);
  TokenSource File = TokenSource::fromFile(Prefix, 9, 10);
  ASSERT_EQ(File.length(), 9u);
  std::vector<int32_t> Got(9);
  File.read(0, Got.size(), Got.data());
  EXPECT_EQ(Got, Want);
  std::vector<int32_t> Window(4);
  File.read(2, Window.size(), Window.data());
  EXPECT_EQ(Window, (std::vector<int32_t>{7, 1, 2, 3}));
  EXPECT_EQ(File.fingerprint(), TokenSource::fromTokens(Want).fingerprint());
  EXPECT_THROW(TokenSource::fromFile(Prefix, 10, 10), RunError);
  try {
    TokenSource::fromFile(Prefix, 1, 9); // token 9 is out of a vocab of 9
    FAIL();
  } catch (const RunError &E) {
    EXPECT_NE(std::string(E.what()).find("token 9 at position 8 (sequence 2)"),
              std::string::npos)
        << E.what();
  }
  // Cut short under the run (as a rewrite in place starts): the next read
  // is an error naming the file, not a read past its end.
  ASSERT_EQ(::truncate((Prefix + ".bin").c_str(), 10), 0);
  try {
    File.read(0, Got.size(), Got.data());
    FAIL();
  } catch (const RunError &E) {
    EXPECT_NE(std::string(E.what()).find("changed during the run"),
              std::string::npos)
        << E.what();
  }
  std::remove((Prefix + ".bin").c_str());
  std::remove((Prefix + ".idx").c_str());
}

} // namespace
