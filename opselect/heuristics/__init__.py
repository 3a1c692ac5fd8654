"""The cost model: per-backend time estimates from device constants (device_model.py), one module
of cost functions per op, and `calibrate` to fit the constants on the device."""
