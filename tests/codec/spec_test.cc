// The codec traits table and spec strings (codec/spec.h): every row parses, canonical forms are
// stable (they are what Codec::spec() prints and job specs store), bad specs name their problem.
#include "codec/spec.h"

#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace longhaul::codec {
namespace {

// Every name a spec may use: the table's names, int<k> spelled out.
std::vector<std::string> AllNames() {
  std::vector<std::string> names;
  for (const CodecTraits& t : CodecTable()) {
    if (t.id == CodecId::kIntK) {
      for (int k = 2; k <= 8; ++k) names.push_back("int" + std::to_string(k));
    } else {
      names.push_back(t.name);
    }
  }
  return names;
}

TEST(CodecSpec, EveryRowParsesWithItsDefaults) {
  for (const std::string& name : AllNames()) {
    absl::StatusOr<CodecSpec> s = ParseCodecSpec(name);
    ASSERT_TRUE(s.ok()) << name << ": " << s.status();
    EXPECT_EQ(s->name, name);
    const CodecTraits* t = FindCodecTraits(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(s->id, t->id) << name;
    absl::StatusOr<CodecSpec> again = ParseCodecSpec(CanonicalSpec(*s));
    ASSERT_TRUE(again.ok()) << CanonicalSpec(*s) << ": " << again.status();
    EXPECT_EQ(*again, *s) << name;
    EXPECT_EQ(CanonicalSpec(*again), CanonicalSpec(*s));
  }
}

// The canonical strings are part of the interface (Codec::spec(), logs, stored job specs).
TEST(CodecSpec, CanonicalFormsOfTheDefaults) {
  const std::pair<const char*, const char*> want[] = {
      {"fp32", "fp32"},
      {"fp16", "fp16"},
      {"bf16", "bf16"},
      {"int2", "int2:g=64"},
      {"int8", "int8:g=64"},
      {"tahquant", "tahquant:g=64,r=0.8,tau=2,bits=4/3,hadamard=on,adaptive=on"},
      {"sdp4bit-qwd", "sdp4bit-qwd:g=2048"},
      {"sdp4bit-tlqhs", "sdp4bit-tlqhs:g=128,bits=4,rounding=nearest"},
      {"zeropp-ulq", "zeropp-ulq:g=128"},
      {"zeropp-qw", "zeropp-qw:g=2048,bits=4"},
      {"bitdp1", "bitdp1"},
      {"bitdp2", "bitdp2"},
      // Parameters given in any order, and spellings the parser accepts, print canonically.
      {"tahquant:adaptive=false,hadamard=0,bits=6,tau=3.5,r=0.25,g=32",
       "tahquant:g=32,r=0.25,tau=3.5,bits=6/6,hadamard=off,adaptive=off"},
      {"sdp4bit-tlqhs:rounding=stochastic,bits=8,g=256", "sdp4bit-tlqhs:g=256,bits=8,rounding=stochastic"},
      {"zeropp-qw:bits=8,g=256", "zeropp-qw:g=256,bits=8"},
      {"int04:g=16", "int4:g=16"},
      {"fp32:", "fp32"},
  };
  for (const auto& [spec, canonical] : want) {
    absl::StatusOr<CodecSpec> s = ParseCodecSpec(spec);
    ASSERT_TRUE(s.ok()) << spec << ": " << s.status();
    EXPECT_EQ(CanonicalSpec(*s), canonical) << spec;
  }
}

TEST(CodecSpec, ParsedParameters) {
  absl::StatusOr<CodecSpec> s = ParseCodecSpec("int5:g=8");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->id, CodecId::kIntK);
  EXPECT_EQ(s->group_quant.group_size, 8);
  EXPECT_EQ(s->group_quant.bits_hi, 5);
  EXPECT_EQ(s->group_quant.bits_lo, 5);
  EXPECT_EQ(s->group_quant.ratio, 1.0f);
  EXPECT_FALSE(s->group_quant.adaptive);
  EXPECT_FALSE(s->group_quant.hadamard);

  s = ParseCodecSpec("sdp4bit-tlqhs:bits=8,rounding=stochastic");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->id, CodecId::kSymQuant);
  EXPECT_EQ(s->sym_quant.bits, 8);
  EXPECT_EQ(s->sym_quant.group_size, 128);
  EXPECT_TRUE(s->sym_quant.hadamard);
  EXPECT_EQ(s->sym_quant.rounding, Rounding::kStochastic);

  s = ParseCodecSpec("bitdp2");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->id, CodecId::kBitDp);
  EXPECT_EQ(s->bitdp_bits, 2);
}

TEST(CodecSpec, RoundTripsNonDefaultSpecs) {
  for (const char* spec : {"int3:g=8", "int7:g=256", "tahquant:g=8,r=0,tau=0.5,bits=8/2,hadamard=off,adaptive=on",
                           "tahquant:r=1,bits=2", "sdp4bit-qwd:g=65536", "sdp4bit-tlqhs:g=32,rounding=stochastic",
                           "zeropp-ulq:g=8", "zeropp-qw:g=8,bits=8"}) {
    absl::StatusOr<CodecSpec> s = ParseCodecSpec(spec);
    ASSERT_TRUE(s.ok()) << spec << ": " << s.status();
    absl::StatusOr<CodecSpec> again = ParseCodecSpec(CanonicalSpec(*s));
    ASSERT_TRUE(again.ok()) << CanonicalSpec(*s);
    EXPECT_EQ(*again, *s) << spec;
  }
  // Different parameters, different specs.
  EXPECT_NE(*ParseCodecSpec("int4"), *ParseCodecSpec("int4:g=32"));
  EXPECT_NE(*ParseCodecSpec("int4"), *ParseCodecSpec("int5"));
  EXPECT_NE(*ParseCodecSpec("zeropp-ulq"), *ParseCodecSpec("sdp4bit-tlqhs:g=128"));
}

TEST(CodecSpec, BadSpecsNameTheProblem) {
  const std::string known =
      "unknown codec (known: fp32 fp16 bf16 int2..int8 tahquant sdp4bit-qwd sdp4bit-tlqhs zeropp-ulq zeropp-qw "
      "bitdp1 bitdp2)";
  const std::pair<const char*, std::string> bad[] = {
      {"", known},
      {"zstd", known},
      {"bitdp3", known},
      {"FP32", known},
      {"int9", "int<k> needs k in 2..8"},
      {"int1", "int<k> needs k in 2..8"},
      {"int", "int<k> needs k in 2..8"},
      {"fp32:g=4", "raw codecs take no parameters"},
      {"bitdp1:x", "bitdp takes no parameters"},
      {"int4:r=0.5", "unknown parameter \"r\""},
      {"tahquant:foo=1", "unknown parameter \"foo\""},
      {"tahquant:g=32,", "unknown parameter \"\""},
      {"zeropp-ulq:rounding=stochastic", "unknown parameter \"rounding\""},
      {"zeropp-ulq:bits=8", "unknown parameter \"bits\""},
      {"int4:g=x", "cannot parse value of \"g\""},
      {"tahquant:bits=x", "cannot parse value of \"bits\""},
      {"tahquant:r=", "cannot parse value of \"r\""},
      {"sdp4bit-qwd:g=x", "cannot parse value of \"g\""},
      {"sdp4bit-tlqhs:bits=3", "bits must be 4 or 8"},
      {"zeropp-qw:bits=x", "bits must be 4 or 8"},
      {"sdp4bit-tlqhs:rounding=up", "rounding is nearest or stochastic"},
      {"tahquant:hadamard=maybe", "expected on/off, got \"maybe\""},
      {"tahquant:adaptive=", "expected on/off, got \"\""},
      // The parameter structs' own checks.
      {"int4:g=48", "group size 48 is not a power of two in [8, 256]"},
      {"int4:g=512", "group size 512 is not a power of two in [8, 256]"},
      {"tahquant:r=1.5", "ratio 1.5 is not in [0, 1]"},
      {"tahquant:tau=-1", "tau -1 must be finite and > 0"},
      {"tahquant:bits=3/4", "bit widths 3/4 out of range (need 2 <= lo <= hi <= 8)"},
      {"sdp4bit-tlqhs:g=48", "group size 48 is not a power of two in [8, 65536]"},
      {"zeropp-qw:g=131072", "group size 131072 is not a power of two in [8, 65536]"},
  };
  for (const auto& [spec, why] : bad) {
    absl::StatusOr<CodecSpec> s = ParseCodecSpec(spec);
    ASSERT_FALSE(s.ok()) << spec;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().message(), "bad codec spec \"" + std::string(spec) + "\": " + why);
  }
}

TEST(CodecTraits, TableIsConsistent) {
  std::set<std::string> names;
  for (const CodecTraits& t : CodecTable()) {
    EXPECT_TRUE(names.insert(t.name).second) << "duplicate row " << t.name;
    EXPECT_NE(std::string(t.description), "") << t.name;
    // Rows sharing a wire id share its frame version: the decoder checks one per id.
    ASSERT_TRUE(FrameVersion(t.id).has_value()) << t.name;
    EXPECT_EQ(*FrameVersion(t.id), t.frame_version) << t.name;
    EXPECT_EQ(t.wire_bytes != 0, t.family == CodecFamily::kRaw) << t.name;
  }
  // Every CodecId (frame.h) has a row; nothing else does.
  for (int id = 1; id <= 7; ++id) EXPECT_NE(CodecTraitsFor(static_cast<CodecId>(id)), nullptr) << id;
  EXPECT_EQ(CodecTraitsFor(static_cast<CodecId>(0)), nullptr);
  EXPECT_EQ(CodecTraitsFor(static_cast<CodecId>(99)), nullptr);
  EXPECT_FALSE(FrameVersion(static_cast<CodecId>(99)).has_value());
}

TEST(CodecTraits, RawWireTypes) {
  EXPECT_EQ(CodecTraitsFor(CodecId::kFp32)->wire_dtype, FrameDtype::kFloat32);
  EXPECT_EQ(CodecTraitsFor(CodecId::kFp32)->wire_bytes, 4);
  EXPECT_EQ(CodecTraitsFor(CodecId::kFp16)->wire_dtype, FrameDtype::kFloat16);
  EXPECT_EQ(CodecTraitsFor(CodecId::kFp16)->wire_bytes, 2);
  EXPECT_EQ(CodecTraitsFor(CodecId::kBf16)->wire_dtype, FrameDtype::kBFloat16);
  EXPECT_EQ(CodecTraitsFor(CodecId::kBf16)->wire_bytes, 2);
}

TEST(CodecTraits, SynopsisAndHelp) {
  EXPECT_EQ(SpecSynopsis(*FindCodecTraits("fp32")), "fp32");
  EXPECT_EQ(SpecSynopsis(*FindCodecTraits("int4")), "int<k>[:g=G]");
  EXPECT_EQ(SpecSynopsis(*FindCodecTraits("tahquant")),
            "tahquant[:g=G,r=R,tau=T,bits=H/L,hadamard=on|off,adaptive=on|off]");
  EXPECT_EQ(SpecSynopsis(*FindCodecTraits("sdp4bit-tlqhs")), "sdp4bit-tlqhs[:g=G,bits=4|8,rounding=nearest|stochastic]");
  EXPECT_EQ(SpecSynopsis(*FindCodecTraits("zeropp-qw")), "zeropp-qw[:g=G,bits=4|8]");
  const std::string help = CodecHelp();
  for (const CodecTraits& t : CodecTable()) {
    EXPECT_NE(help.find(SpecSynopsis(t)), std::string::npos) << t.name;
    EXPECT_NE(help.find(t.description), std::string::npos) << t.name;
  }
  EXPECT_EQ(help.back(), '\n');
}

}  // namespace
}  // namespace longhaul::codec
