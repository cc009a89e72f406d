// SPDX-License-Identifier: Apache-2.0
// SwaMetadata's fields in one list, in the order of the reference's metadata, for the code that
// walks all of them: the host copy (copy_metadata_to_host), the tests' snapshots and diffs, the
// JSON contract (tools/json), the CLI table and the Python module. A new field is a member in
// metadata.h and an entry here; those walkers take it from the list.
#pragma once

#include <cstdint>
#include <type_traits>

#include "sparse_swa/metadata.h"

namespace sparse_swa {

// How many entries an array field (or an index view's rows) holds in a step.
enum class FieldRows : uint8_t {
  kScalar,         // not an array
  kTokens,         // num_tokens
  kDecodeTokens,   // num_decode_tokens
  kPrefillTokens,  // num_prefill_tokens
  kPrefills,       // num_prefills
  kRequests,       // num_reqs
};

// When a field holds data. The reference gives None (JSON null) for an absent array and 0 for an
// absent scalar.
enum class FieldPresence : uint8_t {
  kAlways,
  kPrefill,         // prefill tokens in the step (equivalently, prefill requests)
  kImage,           // the image path ran (SwaMetadata::has_image)
  kFlashinferLens,  // SwaMetadata::has_flashinfer_decode_lens
  kReplayGiven,     // the batch gave replay_start (SwaMetadata::replay_start_given)
};

struct MetadataField {
  const char* name;  // the member of SwaMetadata ("decode_swa", "decode_swa.width")
  // The reference metadata's name: the Python attribute and the JSON contract's key; an index
  // view's arrays are reference + "_indices" and reference + "_lens". nullptr: not in the
  // reference.
  const char* reference = nullptr;
  FieldRows rows = FieldRows::kScalar;
  FieldPresence presence = FieldPresence::kAlways;
  bool host = false;         // host memory whatever md.space (the *_host arrays)
  bool in_contract = false;  // printed by the JSON contract (the reference script's `run`)
  // The contract prints only the prefill tokens' entries [num_decode_tokens, num_tokens).
  bool contract_prefill_part = false;
  // When the contract prints the key: kAlways (null while the field is absent), or, for fields
  // the seed's reference has not, only while this holds (no key otherwise), so that a batch
  // without the new inputs prints exactly the reference's keys.
  FieldPresence contract_key = FieldPresence::kAlways;
  // The CLI table's column for a per-token or per-request field (nullptr: not a column there);
  // consecutive fields with the same column are printed in it joined by '/'.
  const char* table = nullptr;
  const char* doc = "";  // a line of documentation (the Python property's)
};

// Entries of an array field of this kind in `md`.
inline int64_t field_rows(const SwaMetadata& md, FieldRows rows) {
  switch (rows) {
    case FieldRows::kScalar:
      return 0;
    case FieldRows::kTokens:
      return md.num_tokens;
    case FieldRows::kDecodeTokens:
      return md.num_decode_tokens;
    case FieldRows::kPrefillTokens:
      return md.num_prefill_tokens;
    case FieldRows::kPrefills:
      return md.num_prefills;
    case FieldRows::kRequests:
      return md.num_reqs;
  }
  return 0;
}

inline bool field_present(const SwaMetadata& md, FieldPresence presence) {
  switch (presence) {
    case FieldPresence::kAlways:
      return true;
    case FieldPresence::kPrefill:
      return md.has_prefill();
    case FieldPresence::kImage:
      return md.has_image();
    case FieldPresence::kFlashinferLens:
      return md.has_flashinfer_decode_lens();
    case FieldPresence::kReplayGiven:
      return md.replay_start_given;
  }
  return false;
}

// Calls visit(field, member) for every field, in order. `Md` is SwaMetadata or const
// SwaMetadata; a member is one of int32_t, int64_t, bool, LayerTypeSet, std::span<const int32_t>,
// std::span<const uint8_t> and ConstIndexView.
template <typename Md, typename Visit>
void for_each_metadata_field(Md& md, Visit&& visit) {
  static_assert(std::is_same_v<std::remove_const_t<Md>, SwaMetadata>);
  using R = FieldRows;
  using P = FieldPresence;
  visit(
      MetadataField{.name = "causal", .reference = "causal", .doc = "False for DSpark draft rows."},
      md.causal);
  visit(MetadataField{.name = "num_reqs", .reference = "num_reqs"}, md.num_reqs);
  visit(MetadataField{.name = "num_tokens",
                      .reference = "num_tokens",
                      .doc = "T, CUDA-graph padding included."},
        md.num_tokens);
  visit(MetadataField{.name = "num_decodes", .reference = "num_decodes", .in_contract = true},
        md.num_decodes);
  visit(MetadataField{.name = "num_prefills", .reference = "num_prefills", .in_contract = true},
        md.num_prefills);
  visit(MetadataField{.name = "num_decode_tokens",
                      .reference = "num_decode_tokens",
                      .in_contract = true,
                      .doc = "Td."},
        md.num_decode_tokens);
  visit(MetadataField{.name = "num_prefill_tokens",
                      .reference = "num_prefill_tokens",
                      .in_contract = true,
                      .doc = "Tp."},
        md.num_prefill_tokens);
  visit(
      MetadataField{
          .name = "max_decode_query_len", .reference = "max_decode_query_len", .in_contract = true},
      md.max_decode_query_len);
  visit(MetadataField{.name = "decode_swa.width",
                      .reference = "decode_swa_width",
                      .in_contract = true,
                      .doc = "Row width of decode_swa_indices: W (causal) or the DSpark "
                             "non-causal width."},
        md.decode_swa.width);
  visit(MetadataField{.name = "decode_swa",
                      .reference = "decode_swa",
                      .rows = R::kDecodeTokens,
                      .in_contract = true,
                      .doc = "[num_decode_tokens, 1, decode_swa_width] int32 slot ids, -1 = empty "
                             "(the reference's shape), and lens [num_decode_tokens]: row i's "
                             "valid entries are [0, lens[i])."},
        md.decode_swa);
  visit(MetadataField{.name = "flashinfer_decode_topk_lens",
                      .reference = "flashinfer_decode_topk_lens",
                      .rows = R::kDecodeTokens,
                      .presence = P::kFlashinferLens,
                      .in_contract = true,
                      .contract_key = P::kFlashinferLens,
                      .doc = "[num_decode_tokens] int32: max(decode_swa_lens, W), or None unless "
                             "config.flashinfer_decode_lens and a non-causal step."},
        md.flashinfer_decode_topk_lens);
  visit(MetadataField{.name = "flashinfer_decode_seq_lens",
                      .reference = "flashinfer_decode_seq_lens",
                      .rows = R::kDecodeTokens,
                      .presence = P::kFlashinferLens,
                      .in_contract = true,
                      .contract_key = P::kFlashinferLens,
                      .doc = "[num_decode_tokens] int32: seq_lens[token_to_req_indices], or None "
                             "(see flashinfer_decode_topk_lens)."},
        md.flashinfer_decode_seq_lens);
  visit(MetadataField{.name = "prefill_swa",
                      .reference = "prefill_swa",
                      .rows = R::kPrefillTokens,
                      .presence = P::kPrefill,
                      .in_contract = true,
                      .doc = "[num_prefill_tokens, 1, W + max_image_tokens] int32 and lens "
                             "[num_prefill_tokens], or None without prefill tokens."},
        md.prefill_swa);
  visit(MetadataField{.name = "prefill_gather_lens",
                      .reference = "prefill_gather_lens",
                      .rows = R::kPrefills,
                      .presence = P::kPrefill,
                      .in_contract = true,
                      .table = "gather",
                      .doc = "[num_prefills] int32: query_len + min(max(prefix - replay_start, "
                             "0), W - 1), or None."},
        md.prefill_gather_lens);
  visit(MetadataField{.name = "left_visible",
                      .reference = "prefill_left_visible",
                      .rows = R::kTokens,
                      .presence = P::kImage,
                      .in_contract = true,
                      .contract_prefill_part = true,
                      .table = "img L/R",
                      .doc = "[num_tokens] int32 in-image left visibility by absolute token "
                             "(decode rows 0), or None unless the image path ran."},
        md.left_visible);
  visit(MetadataField{.name = "right_visible",
                      .reference = "prefill_right_visible",
                      .rows = R::kTokens,
                      .presence = P::kImage,
                      .in_contract = true,
                      .contract_prefill_part = true,
                      .table = "img L/R",
                      .doc = "[num_tokens] int32, or None (see prefill_left_visible)."},
        md.right_visible);
  visit(MetadataField{.name = "replay_start",
                      .reference = "replay_start",
                      .rows = R::kRequests,
                      .in_contract = true,
                      .contract_key = P::kReplayGiven,
                      .table = "replay",
                      .doc = "[num_reqs] int32: the first position with window KV per request "
                             "(SWA bounded replay); zeros when the build gave none."},
        md.replay_start);
  visit(MetadataField{.name = "token_to_req_indices",
                      .reference = "token_to_req_indices",
                      .rows = R::kTokens,
                      .in_contract = true,
                      .doc = "[num_tokens] int32; padding tokens map to request 0 (num_reqs - 1 "
                             "after a draft update)."},
        md.token_to_req_indices);
  visit(MetadataField{.name = "is_valid_token",
                      .reference = "is_valid_token",
                      .rows = R::kTokens,
                      .in_contract = true,
                      .doc = "[num_tokens] bool: slot_mapping >= 0."},
        md.is_valid_token);
  visit(MetadataField{.name = "tile_schedulers",
                      .reference = "tile_schedulers",
                      .in_contract = true,
                      .doc = "Sorted layer type names that need a tile-scheduler plan this step."},
        md.tile_schedulers);
  visit(MetadataField{.name = "prefill_seq_lens_host",
                      .reference = "prefill_seq_lens_cpu",
                      .rows = R::kPrefills,
                      .presence = P::kPrefill,
                      .host = true,
                      .doc = "[num_prefills] int32 host array, or None."},
        md.prefill_seq_lens_host);
  visit(MetadataField{.name = "prefill_query_lens_host",
                      .reference = "prefill_query_lens_cpu",
                      .rows = R::kPrefills,
                      .presence = P::kPrefill,
                      .host = true,
                      .doc = "[num_prefills] int32 host array, or None."},
        md.prefill_query_lens_host);
  visit(
      MetadataField{
          .name = "window_size", .reference = "prefill_window_size", .presence = P::kPrefill},
      md.window_size);
  visit(
      MetadataField{
          .name = "max_model_len", .reference = "prefill_max_model_len", .presence = P::kPrefill},
      md.max_model_len);
  visit(MetadataField{.name = "max_num_batched_tokens",
                      .reference = "prefill_max_num_batched_tokens",
                      .presence = P::kPrefill},
        md.max_num_batched_tokens);
}

}  // namespace sparse_swa
