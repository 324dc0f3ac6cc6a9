// Streamed dump layers (latentq/layer_store.h).
#include "latentq/layer_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace latentq {

struct LayerStore::Slot {
  int index = 0;
  std::mutex load;                    // held while the layer is read
  std::shared_ptr<const Layer> data;  // null until read
  bool attention = false;             // read with the attention datasets
  int users = 0;                      // open accesses (guarded by the store's mutex)
  struct Shared {
    std::mutex m;
    std::shared_ptr<const void> value;
  };
  std::mutex shared_mutex;
  std::map<std::string, std::shared_ptr<Shared>> shared;
};

class StoreAccess final : public LayerAccess {
 public:
  StoreAccess(LayerStore& store, std::vector<std::shared_ptr<LayerStore::Slot>> slots)
      : store_(store), slots_(std::move(slots)) {}
  ~StoreAccess() override {
    store_.close(slots_);
    // The last holder of a dropped layer frees it here: return the freed memory to the system (glibc
    // keeps large freed blocks in its arenas otherwise, and the peak RSS would grow with the layers).
    bool last = false;
    for (const auto& s : slots_) last = last || s.use_count() == 1;
    data_.clear();
    slots_.clear();
#ifdef __GLIBC__
    if (last) malloc_trim(0);
#endif
  }

  const Dump& header() const override { return store_.header(); }
  const Layer& layer(int index) const override {
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i]->index == index && i < data_.size()) return *data_[i];
    throw std::invalid_argument(fmt::format("layer {} is not one of the layers this cell opened", index));
  }
  void hold(std::shared_ptr<const Layer> d) { data_.push_back(std::move(d)); }
  const probes::AttentionDeviceFactory* attention_device() const override { return &store_.attention_device(); }

 protected:
  std::shared_ptr<const void> shared_any(int layer, const std::string& name,
                                         const std::function<std::shared_ptr<const void>()>& make) const override {
    LayerStore::Slot& s = slot(layer);
    std::shared_ptr<LayerStore::Slot::Shared> e;
    {
      const std::lock_guard<std::mutex> lk(s.shared_mutex);
      auto& p = s.shared[name];
      if (!p) p = std::make_shared<LayerStore::Slot::Shared>();
      e = p;
    }
    const std::lock_guard<std::mutex> lk(e->m);
    if (!e->value) e->value = make();
    return e->value;
  }

 private:
  LayerStore::Slot& slot(int index) const {
    for (const auto& s : slots_)
      if (s->index == index) return *s;
    throw std::invalid_argument(fmt::format("layer {} is not one of the layers this cell opened", index));
  }
  LayerStore& store_;
  std::vector<std::shared_ptr<LayerStore::Slot>> slots_;
  std::vector<std::shared_ptr<const Layer>> data_;  // what this cell reads (a reload never frees it under it)
};

LayerStore::LayerStore(Dump header) : header_(std::move(header)) {}
LayerStore::~LayerStore() = default;

void LayerStore::expect(const std::vector<LayerUse>& uses) {
  const std::lock_guard<std::mutex> lk(mutex_);
  remaining_.clear();
  attention_.clear();
  for (const LayerUse& u : uses)
    for (int l : u.layers) {
      ++remaining_[l];
      attention_[l] = attention_[l] || u.attention;
    }
}

std::unique_ptr<LayerAccess> LayerStore::open(const LayerUse& use) {
  std::vector<std::shared_ptr<Slot>> slots;
  {
    const std::lock_guard<std::mutex> lk(mutex_);
    for (int l : use.layers) {
      if (std::none_of(header_.layers.begin(), header_.layers.end(), [&](const Layer& x) { return x.index == l; }))
        throw std::invalid_argument(fmt::format("{}: layer {} is not studied", header_.path.string(), l));
      auto& s = loaded_[l];
      if (!s) {
        s = std::make_shared<Slot>();
        s->index = l;
      }
      ++s->users;
      slots.push_back(s);
    }
    peak_ = std::max(peak_, loaded_.size());
  }
  auto access = std::make_unique<StoreAccess>(*this, slots);  // closes the use on any exit
  for (const auto& s : slots) {
    const std::lock_guard<std::mutex> lk(s->load);
    bool attention = use.attention;
    {
      const std::lock_guard<std::mutex> g(mutex_);
      if (const auto it = attention_.find(s->index); it != attention_.end()) attention = attention || it->second;
    }
    if (!s->data || (use.attention && !s->attention)) {
      s->data = std::make_shared<const Layer>(read_layer(header_, s->index, attention));
      s->attention = attention;
      const std::lock_guard<std::mutex> g(mutex_);
      ++reads_;
    }
    access->hold(s->data);
  }
  return access;
}

void LayerStore::close(const std::vector<std::shared_ptr<Slot>>& slots) {
  const std::lock_guard<std::mutex> lk(mutex_);
  for (const auto& s : slots) {
    --s->users;
    auto r = remaining_.find(s->index);
    if (r != remaining_.end() && r->second > 0) --r->second;
    const bool more = r != remaining_.end() && r->second > 0;
    if (s->users == 0 && !more) {
      const auto it = loaded_.find(s->index);
      if (it != loaded_.end() && it->second == s) loaded_.erase(it);  // freed when the last access lets go
    }
  }
}

size_t LayerStore::reads() const {
  const std::lock_guard<std::mutex> lk(mutex_);
  return reads_;
}
size_t LayerStore::peak_loaded() const {
  const std::lock_guard<std::mutex> lk(mutex_);
  return peak_;
}

}  // namespace latentq
