// SPDX-License-Identifier: Apache-2.0
// The dispatch-width policy (sparse_swa/dispatch_policy.h) for Python, host only: the private
// functions sparse_swa.dispatch wraps. Policies are named by their built-in names.
#include "dispatch_binding.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "config_binding.h"
#include "python_values.h"
#include "sparse_swa/dispatch_policy.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

DispatchPolicy policy_from(nb::handle name) {
  const std::string text = string_from_python(name, "policy");
  auto policy = builtin_policy(text);
  if (!policy.ok()) {
    std::string names;
    for (const std::string& n : builtin_policy_names()) {
      names += str_cat(names.empty() ? "" : ", ", "\"", n, "\"");
    }
    raise_value_error(
        str_cat("policy: expected a built-in policy name (", names, "), got ", value_text(name)));
  }
  return std::move(policy).value();
}

DispatchTuple tuple_from(nb::handle heads, nb::handle topk, nb::handle page_block_size,
                         nb::handle extra_topk, nb::handle extra_page_block_size) {
  DispatchTuple t;
  t.heads = int32_from_python(heads, "heads");
  t.topk = int32_from_python(topk, "topk");
  t.page_block_size = int32_from_python(page_block_size, "page_block_size");
  t.extra_topk = int32_from_python(extra_topk, "extra_topk");
  t.extra_page_block_size = int32_from_python(extra_page_block_size, "extra_page_block_size");
  return t;
}

DeploymentShape shape_from(nb::handle heads, nb::handle attn_block_size, nb::handle indexer_topk) {
  DeploymentShape s;
  s.heads = int32_from_python(heads, "heads");
  s.attn_block_size = int32_from_python(attn_block_size, "attn_block_size");
  s.indexer_topk = int32_from_python(indexer_topk, "indexer_topk");
  return s;
}

// The library names the DeploymentShape fields and choose_width's argument; Python passes them
// as keywords.
Status shape_names(const Status& status) {
  return renamed_fields(status, {{"deployment.", ""}, {"choose_width.needed", "needed"}});
}

nb::dict tuple_dict(const DispatchTuple& t) {
  nb::dict d;
  d["heads"] = t.heads;
  d["topk"] = t.topk;
  d["page_block_size"] = t.page_block_size;
  d["extra_topk"] = t.extra_topk;
  d["extra_page_block_size"] = t.extra_page_block_size;
  return d;
}

}  // namespace

void bind_dispatch(nb::module_& m) {
  m.def("_dispatch_policy_names", &builtin_policy_names);
  m.def(
      "_dispatch_policy_info",
      [](nb::handle name) {
        const DispatchPolicy p = policy_from(name);
        nb::dict d;
        d["name"] = p.name;
        d["layout"] = index_layout_name(p.layout);
        d["reads_prefill_rows"] = p.reads_prefill_rows;
        d["max_topk"] = p.max_topk;
        d["description"] = p.describe();
        return d;
      },
      nb::arg("policy").none());
  m.def(
      "_dispatch_accepts",
      [](nb::handle policy, nb::handle heads, nb::handle topk, nb::handle page_block_size,
         nb::handle extra_topk, nb::handle extra_page_block_size) {
        return policy_from(policy).accepts(
            tuple_from(heads, topk, page_block_size, extra_topk, extra_page_block_size));
      },
      nb::arg("policy").none(), nb::arg("heads").none(), nb::arg("topk").none(),
      nb::arg("page_block_size").none(), nb::arg("extra_topk").none(),
      nb::arg("extra_page_block_size").none());
  m.def(
      "_dispatch_choose_width",
      [](nb::handle needed, nb::handle policy, nb::handle heads, nb::handle page_block_size,
         nb::handle extra_topk, nb::handle extra_page_block_size) {
        const int32_t n = int32_from_python(needed, "needed");
        const DispatchPolicy p = policy_from(policy);
        const DispatchTuple shape =
            tuple_from(heads, nb::int_(0), page_block_size, extra_topk, extra_page_block_size);
        auto width = choose_width(n, p, shape);
        throw_if_error(shape_names(width.status()));
        return width.value();
      },
      nb::arg("needed").none(), nb::arg("policy").none(), nb::arg("heads").none(),
      nb::arg("page_block_size").none(), nb::arg("extra_topk").none(),
      nb::arg("extra_page_block_size").none());
  m.def(
      "_dispatch_validate_config",
      [](nb::handle config, nb::handle policy, nb::handle heads, nb::handle attn_block_size,
         nb::handle indexer_topk) {
        const BuilderConfig c = config_from_object(config);
        throw_if_error(shape_names(validate_config(
            c, policy_from(policy), shape_from(heads, attn_block_size, indexer_topk))));
      },
      nb::arg("config").none(), nb::arg("policy").none(), nb::arg("heads").none(),
      nb::arg("attn_block_size").none(), nb::arg("indexer_topk").none());
  m.def(
      "_dispatch_choose_noncausal_width",
      [](nb::handle config, nb::handle policy, nb::handle heads, nb::handle attn_block_size,
         nb::handle indexer_topk) {
        const BuilderConfig c = config_from_object(config);
        auto width = choose_noncausal_width(c, policy_from(policy),
                                            shape_from(heads, attn_block_size, indexer_topk));
        throw_if_error(shape_names(width.status()));
        return width.value();
      },
      nb::arg("config").none(), nb::arg("policy").none(), nb::arg("heads").none(),
      nb::arg("attn_block_size").none(), nb::arg("indexer_topk").none());
  m.def(
      "_dispatch_tuples",
      [](nb::handle config, nb::handle policy, nb::handle heads, nb::handle attn_block_size,
         nb::handle indexer_topk) {
        const BuilderConfig c = config_from_object(config);
        auto checks = enumerate_dispatch_tuples(c, policy_from(policy),
                                                shape_from(heads, attn_block_size, indexer_topk));
        throw_if_error(shape_names(checks.status()));
        nb::list out;
        for (const TupleCheck& t : checks.value()) {
          nb::dict d = tuple_dict(t.tuple);
          d["source"] = t.source;
          d["accepted"] = t.accepted;
          out.append(d);
        }
        return out;
      },
      nb::arg("config").none(), nb::arg("policy").none(), nb::arg("heads").none(),
      nb::arg("attn_block_size").none(), nb::arg("indexer_topk").none());
}

}  // namespace sparse_swa::python
