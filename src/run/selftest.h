// `run --selftest`: the audit proved on the user's own program. For each of forward, backward and
// optimizer, one op of run-0 that made a value is chosen, and a run of its own changes one element
// of that value as the op ends (hooks/capture/op_plant.h). The diff of run-0 with that run must
// name the op at its step: found late, the change shows where the recorder is blind; not found,
// the audit failed (exit 6).
//
//   std::vector<PlantChoice> plants;  choose_plants(run0, &plants, &notes);
//   ... record OUT/selftest-<phase>/run-0 with DETAUDIT_CAPTURE = plant_spec_json(p, dir) ...
//   SelfTest t;  t.plants.push_back(judge_plant(p, planted, diff));  summarize(&t);
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "diff/report_model.h"
#include "replay/replay.h"
#include "run/session.h"
#include "util/status.h"

namespace detaudit {
class Catalog;
}  // namespace detaudit

namespace detaudit::run {

struct PlantChoice {
  std::string phase;        // forward | backward | optimizer: the op's
  std::string kind;         // the phase whose value it is, or "silent"
  bool input = false;       // change what it read: a sentinel step state's gradients
  replay::ReplayTarget op;  // in run-0: stream, index, step, process, thread, occurrence
};

// From run-0's first stream (rank 0's main thread): for each phase, the middle one of the ops
// that made a value at the step before the last recorded one, or the nearest step that has one.
// An op made a value when it returned a floating-point tensor that no op inside it returned and
// none of its inputs is (a view, an op returning what its kernel made, are not); under the
// sentinel, the backward's value is the gradients a step state read. One more, "silent", where
// a dispatcher op returned nothing and declares no write yet reads floating-point tensors: one
// that writes through data_ptr is seen there. `notes`: phases with no plant, and why.
Status choose_plants(const std::string& run0, std::vector<PlantChoice>* plants,
                     std::vector<std::string>* notes);

// The spec the interposer reads (DETAUDIT_CAPTURE); `dir` is where it writes plant.json.
nlohmann::json plant_spec_json(const PlantChoice& p, const std::string& dir, double relative);

// One plant judged from its plant.json (null: the run never reached the op) and the diff of run-0
// with the plant's run.
SelfTest::Plant judge_plant(const PlantChoice& p, const nlohmann::json& planted,
                            const DiffReport& diff);
// Sets passed and outcome from the plants: a plant that failed (SelfTest::fails) fails it, and
// so does a self-test that planted nothing.
void summarize(SelfTest* t);

// Told of each plant's run: the caller's warnings.
using PlantRunFn = std::function<void(const RunOutcome& outcome, int index)>;

// Records one run per plant into OUT/selftest-<phase>/run-0, with run-0's config, and diffs each
// with run-0 under a gate that fails on any difference. The catalog may be null.
Status run_selftest(const Config& config, const RunOptions& options, const std::string& run0,
                    const Catalog* catalog, const PlantRunFn& on_run, SelfTest* out);

}  // namespace detaudit::run
