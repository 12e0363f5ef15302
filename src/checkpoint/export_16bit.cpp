// save_16bit_model: the engine's weights, gathered unit by unit, written by rank 0 as Hugging Face safetensors.
#include <memory>

#include "checkpoint/model_buffers.hpp"
#include "checkpoint/model_export.hpp"
#include "checkpoint/rank_reports.hpp"
#include "core/check.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/safetensors.hpp"

namespace zero3 {

namespace fs = std::filesystem;
namespace st = safetensors;

ExportedModel save_16bit_model(Engine& engine, const fs::path& out_dir, const ExportOptions& options) {
  ZERO3_REQUIRE(engine.materialized(), InvalidArgument, "save_16bit_model: the engine is not materialized yet");
  const DType compute = engine.compute_dtype();
  const DType dtype = options.dtype.value_or(compute != DType::f32 ? compute : DType::bf16);
  const int rank = engine.rank();
  if (engine.stage() == 3 && !engine.config().zero.gather_16bit_weights_on_model_save) {
    log::info_rank0(
        "save_16bit_model: zero_optimization.stage3_gather_16bit_weights_on_model_save is false; "
        "zero3 gathers and writes the weights anyway (DeepSpeed would silently write nothing)");
  }
  std::vector<ckpt::ExportSource> sources;
  for (size_t u = 0; u < engine.num_units(); ++u) {
    for (ParamId pid : engine.unit(UnitId{static_cast<int32_t>(u)}).params) {
      const ParamInfo& p = engine.param(pid);
      sources.push_back({p.name, p.local_name, static_cast<int>(u), p.offset, p.numel, p.shape, p.dtype});
    }
  }
  const std::vector<ckpt::ExportParam> params = ckpt::plan_export(sources, options, dtype);
  // The model's buffers follow the parameters, rank 0's values in their own types (every rank lists the same).
  const std::vector<ModelBuffer> buffers = engine.buffers();
  const std::vector<st::TensorDecl> buffer_decls = ckpt::buffer_decls(ckpt::describe_buffers(buffers));

  ckpt::RankReport mine;
  std::unique_ptr<st::ShardedSafetensorsWriter> writer;
  auto fail = [&](const std::exception& e) {
    mine.ok = false;
    mine.message = "writing to " + out_dir.string() + ": " + e.what();
    writer.reset();  // removes its temporary file
  };
  if (rank == 0) {
    try {
      std::error_code ec;
      fs::create_directories(out_dir, ec);
      if (ec) throw IoError("cannot create " + out_dir.string() + ": " + ec.message());
      std::vector<st::TensorDecl> decls;
      for (const ckpt::ExportParam& p : params) decls.push_back(p.decl);
      ckpt::check_export_names(decls, ckpt::describe_buffers(buffers));
      decls.insert(decls.end(), buffer_decls.begin(), buffer_decls.end());
      writer = std::make_unique<st::ShardedSafetensorsWriter>(out_dir, decls, options.max_shard_bytes);
    } catch (const std::exception& e) {
      fail(e);
    }
  }
  // Every rank takes part in every gather, whatever happened to rank 0's files, so the collectives match.
  std::vector<float> unit_buf;  // (numel) of one unit
  size_t next = 0;
  for (size_t u = 0; u < engine.num_units(); ++u) {
    const UnitInfo& info = engine.unit(UnitId{static_cast<int32_t>(u)});
    unit_buf.resize(static_cast<size_t>(info.numel));
    engine.gather_master_params(info.id, unit_buf.data());
    for (; next < params.size() && params[next].unit == static_cast<int>(u); ++next) {
      if (!writer) continue;
      const ckpt::ExportParam& p = params[next];
      try {
        writer->write_from_f32(p.decl.name, unit_buf.data() + p.offset, p.numel);
      } catch (const std::exception& e) {
        fail(e);
      }
    }
  }
  if (writer) {
    try {
      for (const ModelBuffer& b : buffers) writer->write(b.name, b.data, static_cast<size_t>(ckpt::buffer_bytes(b)));
      writer->finish();
      mine.a = ckpt::describe_export(out_dir, params, options.max_shard_bytes, true, buffer_decls).bytes;
    } catch (const std::exception& e) {
      fail(e);
    }
  }
  const std::vector<ckpt::RankReport> reports =
      ckpt::exchange_reports(engine, mine, "save_16bit_model to " + out_dir.string());
  ckpt::throw_if_any_failed(reports, "save_16bit_model");
  ExportedModel m = ckpt::describe_export(out_dir, params, options.max_shard_bytes, false, buffer_decls);
  m.bytes = reports[0].a;
  m.dtype = dtype;
  log::info_rank0("save_16bit_model: ", m.summary());
  return m;
}

}  // namespace zero3
