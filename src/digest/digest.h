// Content digests and statistics of tensor data: the hashers, the statistics, and the digester
// that computes both in one pass; the device digest's shared code is in lane_digest.h.
#pragma once

#include "digest/device_digest.h"
#include "digest/hashers.h"
#include "digest/stats.h"
#include "digest/tensor_digester.h"
