#include "checkpoint/model_export.hpp"

#include <cstdio>
#include <system_error>

namespace zero3::ckpt {
namespace st = safetensors;

std::vector<ExportParam> plan_export(const std::vector<ExportSource>& sources, const ExportOptions& options,
                                     std::optional<DType> dtype) {
  std::vector<NamedParam> named;
  for (const ExportSource& s : sources) named.push_back({s.full_name, s.local_name});
  const std::vector<std::string> names = export_names(named, options);
  std::vector<ExportParam> out;
  for (size_t i = 0; i < sources.size(); ++i) {
    const ExportSource& s = sources[i];
    out.push_back(
        {s.unit, s.offset, s.numel, st::TensorDecl{names[i], st::from_dtype(dtype.value_or(s.dtype)), s.shape}});
  }
  return out;
}

ExportedModel describe_export(const std::filesystem::path& out_dir, const std::vector<ExportParam>& params,
                              uint64_t max_shard_bytes, bool stat_files, const std::vector<st::TensorDecl>& buffers) {
  std::vector<st::TensorDecl> decls;
  ExportedModel m;
  m.dir = out_dir;
  for (const ExportParam& p : params) {
    decls.push_back(p.decl);
    m.parameters += p.numel;
  }
  decls.insert(decls.end(), buffers.begin(), buffers.end());
  m.tensors = static_cast<int64_t>(decls.size());
  const std::vector<st::ShardPlan> plan = st::plan_shards(decls, max_shard_bytes, "model");
  for (const st::ShardPlan& s : plan) m.files.push_back(s.file_name);
  if (plan.size() > 1) m.files.push_back("model.safetensors.index.json");
  if (stat_files) {
    for (const std::string& f : m.files) {
      std::error_code ec;
      const uintmax_t n = std::filesystem::file_size(out_dir / f, ec);
      if (!ec) m.bytes += n;
    }
  }
  return m;
}

DType export_dtype(const std::vector<ExportParam>& params, std::optional<DType> dtype) {
  if (dtype) return *dtype;
  if (params.empty()) return DType::f32;
  return st::to_dtype(params[0].decl.dtype).value_or(DType::f32);
}

}  // namespace zero3::ckpt

namespace zero3 {

std::string ExportedModel::summary() const {
  char size[64];
  if (bytes >= 1'000'000'000)
    std::snprintf(size, sizeof(size), "%.2f GB", static_cast<double>(bytes) / 1e9);
  else if (bytes >= 1'000'000)
    std::snprintf(size, sizeof(size), "%.2f MB", static_cast<double>(bytes) / 1e6);
  else
    std::snprintf(size, sizeof(size), "%llu bytes", static_cast<unsigned long long>(bytes));
  std::string list;
  for (size_t i = 0; i < files.size() && i < 3; ++i) list += (i ? ", " : "") + files[i];
  if (files.size() > 3) list += ", ...";
  return "wrote " + std::to_string(tensors) + " tensors (" + std::to_string(parameters) + " parameters, " +
         std::string(dtype_name(dtype)) + ") in " + std::to_string(files.size()) +
         (files.size() == 1 ? " file (" : " files (") + list + "), " + size + ", to " + dir.string();
}

}  // namespace zero3
