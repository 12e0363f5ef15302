// consolidate_checkpoint: a checkpoint's fp32 master weights as Hugging Face safetensors, one unit in memory at a
// time: for each unit, the slices of every rank file are read into one buffer and its parameters streamed into
// the sharded writer.
#include <map>
#include <optional>

#include "checkpoint/manifest.hpp"
#include "checkpoint/model_buffers.hpp"
#include "checkpoint/model_export.hpp"
#include "checkpoint/reshard.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/safetensors.hpp"

namespace zero3 {

namespace fs = std::filesystem;
namespace st = safetensors;

ExportedModel consolidate_checkpoint(const fs::path& dir, const std::string& tag, const fs::path& out_dir,
                                     const ExportOptions& options) {
  const CheckpointInfo info = options.verify ? verify_checkpoint(dir, tag) : read_checkpoint_info(dir, tag);
  std::vector<ckpt::ExportSource> sources;
  for (size_t u = 0; u < info.units.size(); ++u) {
    for (const CheckpointParam& p : info.units[u].params) {
      sources.push_back({p.full_name, p.name, static_cast<int>(u), p.offset, p.numel, p.shape, p.dtype});
    }
  }
  const std::vector<ckpt::ExportParam> params = ckpt::plan_export(sources, options, options.dtype);
  std::vector<st::TensorDecl> decls;
  for (const ckpt::ExportParam& p : params) decls.push_back(p.decl);
  ckpt::check_export_names(decls, info.buffers);
  const std::vector<st::TensorDecl> buffer_decls = ckpt::buffer_decls(info.buffers);
  decls.insert(decls.end(), buffer_decls.begin(), buffer_decls.end());

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw IoError("cannot create the output directory " + out_dir.string() + ": " + ec.message());
  st::ShardedSafetensorsWriter writer(out_dir, decls, options.max_shard_bytes);
  std::map<int, st::SafetensorsReader> readers;  // opened as needed, kept for the units after
  std::vector<float> unit_buf;                   // (numel) of the unit being written: the peak memory
  size_t next = 0;
  for (size_t u = 0; u < info.units.size(); ++u) {
    const CheckpointUnit& unit = info.units[u];
    unit_buf.assign(static_cast<size_t>(unit.numel), 0.0f);
    const std::string name = ckpt::shard_tensor_name(unit.name, ckpt::StatePart::master);
    for (const ckpt::RangeRead& r : ckpt::plan_reads(info, static_cast<int>(u), 0, unit.numel)) {
      auto it = readers.find(r.file);
      if (it == readers.end()) {
        it = readers.emplace(r.file, st::SafetensorsReader(info.path / info.files[static_cast<size_t>(r.file)].name))
                 .first;
      }
      it->second.read_range(name, r.src_offset, r.src_offset + r.count, unit_buf.data() + r.dst_offset);
    }
    for (; next < params.size() && params[next].unit == static_cast<int>(u); ++next) {
      const ckpt::ExportParam& p = params[next];
      writer.write_from_f32(p.decl.name, unit_buf.data() + p.offset, p.numel);
    }
  }
  ckpt::export_buffers(info, writer);
  writer.finish();
  ExportedModel m = ckpt::describe_export(out_dir, params, options.max_shard_bytes, true, buffer_decls);
  m.dtype = ckpt::export_dtype(params, options.dtype);
  log::info("consolidated checkpoint ", info.path.string(), " (global step ", info.training_state.global_steps,
            "): ", m.summary());
  return m;
}

}  // namespace zero3
