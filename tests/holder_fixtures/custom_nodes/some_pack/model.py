"""Fixture: a model class with a class-level cache shared by all instances (the Qwen-Image-2512 leak shape)."""


class QwenImageModel:
    _cache = {}

    def load_weights(self, ckpt_path, resolution, loader):
        key = f"{ckpt_path}_{resolution}"
        if key not in self._cache:
            self._cache[key] = loader()
        return self._cache[key]
