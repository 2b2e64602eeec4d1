// MANIFEST encoding and parsing (manifest.h).
#include "checkpoint/manifest.h"

#include <charconv>
#include <cstdio>

#include "common/crc32c.h"

namespace ember::checkpoint {
namespace {

constexpr std::string_view kHeader = "ember-checkpoint 1";

std::string Hex8(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

// A decimal number with no sign, no leading zeros (but "0"), that fits.
template <typename T>
std::optional<T> ParseDecimal(std::string_view s) {
  if (s.empty() || s.size() > 19 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

std::optional<uint32_t> ParseHex8(std::string_view s) {
  if (s.size() != 8) return std::nullopt;
  uint32_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    v = (v << 4) | static_cast<uint32_t>(d);
  }
  return v;
}

// Splits `line` at single spaces.
std::vector<std::string_view> Fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (true) {
    size_t j = line.find(' ', i);
    out.push_back(line.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i));
    if (j == std::string_view::npos) return out;
    i = j + 1;
  }
}

}  // namespace

bool ValidBlobName(std::string_view name) {
  if (name.empty() || name.size() > kMaxBlobNameLength || name[0] == '.' || name == kManifestName) {
    return false;
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string EncodeManifest(const Manifest& m) {
  std::string out(kHeader);
  out += "\nstep " + std::to_string(m.step) + "\n";
  for (const auto& b : m.blobs) {
    out += "blob " + b.name + " " + std::to_string(b.size) + " " + Hex8(b.crc32c) + "\n";
  }
  out += "crc " + Hex8(crc32c::Value(out)) + "\n";
  return out;
}

Result<Manifest> ParseManifest(std::string_view bytes, const std::string& uri) {
  auto bad = [&uri](const std::string& what) { return Status::Corruption(uri + ": bad checkpoint manifest: " + what); };
  if (bytes.size() > kMaxManifestBytes) return bad("larger than " + std::to_string(kMaxManifestBytes) + " bytes");
  if (bytes.empty() || bytes.back() != '\n') return bad("truncated (no final newline)");
  // The checksum line first: nothing else is trusted before it matches.
  const size_t last = bytes.rfind('\n', bytes.size() - 2);
  const size_t body_len = last == std::string_view::npos ? 0 : last + 1;
  const auto crc_fields = Fields(bytes.substr(body_len, bytes.size() - body_len - 1));
  std::optional<uint32_t> crc;
  if (crc_fields.size() == 2 && crc_fields[0] == "crc") crc = ParseHex8(crc_fields[1]);
  if (!crc) return bad("no checksum line");
  if (*crc != crc32c::Value(bytes.substr(0, body_len))) return bad("checksum mismatch");

  Manifest m;
  size_t pos = 0;
  int line_no = 0;
  bool have_step = false;
  while (pos < body_len) {
    const size_t nl = bytes.find('\n', pos);  // body ends with '\n'
    const std::string_view line = bytes.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    const std::string where = "line " + std::to_string(line_no);
    if (line_no == 1) {
      if (line != kHeader) return bad(where + ": not \"" + std::string(kHeader) + "\"");
      continue;
    }
    const auto f = Fields(line);
    if (line_no == 2) {
      std::optional<int64_t> step;
      if (f.size() == 2 && f[0] == "step") step = ParseDecimal<int64_t>(f[1]);
      if (!step) return bad(where + ": expected \"step <n>\"");
      m.step = *step;
      have_step = true;
      continue;
    }
    if (f.size() != 4 || f[0] != "blob") return bad(where + ": expected \"blob <name> <size> <crc32c>\"");
    if (!ValidBlobName(f[1])) return bad(where + ": invalid blob name");
    if (!m.blobs.empty() && !(m.blobs.back().name < f[1])) return bad(where + ": blob names not sorted or repeated");
    auto size = ParseDecimal<int64_t>(f[2]);
    auto blob_crc = ParseHex8(f[3]);
    if (!size || !blob_crc) return bad(where + ": bad size or crc32c");
    m.blobs.push_back(BlobInfo{std::string(f[1]), static_cast<uint64_t>(*size), *blob_crc});
  }
  if (!have_step) return bad("no step line");
  return m;
}

std::string CheckpointDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "ckpt-%010lld", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> StepOfDirName(std::string_view name) {
  if (!name.starts_with("ckpt-")) return std::nullopt;
  std::string_view digits = name.substr(5);
  if (digits.size() < 10 || digits.size() > 19) return std::nullopt;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  int64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size() || v < 0) return std::nullopt;
  if (CheckpointDirName(v) != name) return std::nullopt;  // one name per step
  return v;
}

}  // namespace ember::checkpoint
