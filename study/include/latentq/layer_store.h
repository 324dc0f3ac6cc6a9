// latentq/layer_store.h — the dump layers of a run, streamed: a layer is read from the HDF5 file when
// the first cell that needs it starts and dropped when the last cell expected to need it ends, so a
// run holds the layers of the cells in flight (and of windows still open), never the whole dump.
// Values derived from a layer and shared by its cells (LayerAccess::shared: an SVD basis, the
// reference attention) are dropped with it.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "latentq/dump.h"
#include "latentq/probe_registry.h"

namespace latentq {

/// The layers one cell reads, and whether it reads their attention datasets.
struct LayerUse {
  std::vector<int> layers;
  bool attention = false;
};

class LayerStore {
 public:
  /// `header`: load_dump(path, {layers, attention, data = false}). Thread-safe after construction.
  explicit LayerStore(Dump header);
  ~LayerStore();
  LayerStore(const LayerStore&) = delete;
  LayerStore& operator=(const LayerStore&) = delete;

  const Dump& header() const { return header_; }

  /// Announce the cells that will open() layers, one LayerUse per cell (replaces earlier ones). A
  /// layer stays loaded from its first open() until every announced use of it closed; a layer is
  /// read with its attention datasets when any announced use asks for them. Without announcements a
  /// layer is dropped as soon as no open access holds it.
  void expect(const std::vector<LayerUse>& uses);

  /// The data of `use.layers` for one cell (reads the layers not loaded: read_layer(), HDF5 under
  /// h5::library_mutex()). Closing the access (its destructor) counts the use as done. Throws as
  /// read_layer() (the file's path, layer and dataset named) and std::invalid_argument for a layer
  /// not studied.
  std::unique_ptr<LayerAccess> open(const LayerUse& use);

  /// Layers read from the file so far (a layer read again after being dropped counts again).
  size_t reads() const;
  /// The most layers held at once so far.
  size_t peak_loaded() const;

  /// The device the attention probes evaluate on (LatentBackend::attention_device; empty: the CPU), which
  /// every access returns from LayerAccess::attention_device. Set before the first open().
  void set_attention_device(probes::AttentionDeviceFactory f) { attention_device_ = std::move(f); }
  const probes::AttentionDeviceFactory& attention_device() const { return attention_device_; }

  struct Slot;

 private:
  friend class StoreAccess;
  void close(const std::vector<std::shared_ptr<Slot>>& slots);

  Dump header_;
  mutable std::mutex mutex_;
  std::map<int, std::shared_ptr<Slot>> loaded_;  // layers held (or being read)
  std::map<int, long long> remaining_;           // announced uses not yet closed
  std::map<int, bool> attention_;                // announced uses ask for the attention datasets
  size_t reads_ = 0, peak_ = 0;
  probes::AttentionDeviceFactory attention_device_;
};

}  // namespace latentq
