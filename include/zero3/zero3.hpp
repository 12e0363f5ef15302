// zero3: ZeRO stage 3 for C++ training code. The umbrella header: include this one.
#pragma once

#include "zero3/dtype.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/version.hpp"
#include "zero3/config.hpp"
#include "zero3/stream.hpp"
#include "zero3/comm.hpp"
#include "zero3/store.hpp"
#include "zero3/device.hpp"
#include "zero3/engine.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/crc32c.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/safetensors.hpp"
