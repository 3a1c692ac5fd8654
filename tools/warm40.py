"""Write a 40-item warm spec (isin, softmax, permute, topk) for the sharded-warm timing."""
import json
import sys

entries = []
for m in (10000, 100000, 1000000, 4000000, 16000000):
    for n in (32, 4096):
        entries.append({"op": "isin", "shapes": [[m], [n]], "dtypes": ["int32"]})
for rows, cols in ((64, 512), (256, 1000), (1024, 3000), (4096, 4096), (8, 32000),
                   (2, 151936), (512, 8192), (32, 50257), (128, 128), (1024, 1024)):
    entries.append({"op": "softmax", "shapes": [[rows, cols]], "dtypes": ["float32"]})
for shape, dims in (((64, 197, 12, 64), [0, 2, 1, 3]), ((2048, 2048), [1, 0]),
                    ((32, 224, 224, 3), [0, 3, 1, 2]), ((50000, 3), [1, 0]),
                    ((8, 512, 64, 64), [0, 2, 1, 3]), ((4096, 1024), [1, 0]),
                    ((16, 3, 512, 512), [0, 2, 3, 1]), ((100, 200, 300), [2, 1, 0]),
                    ((1500, 8, 16, 64), [1, 2, 0, 3]), ((3, 1080, 1920, 4), [0, 3, 1, 2])):
    entries.append({"op": "permute", "shapes": [list(shape)], "dtypes": ["float16"],
                    "options": {"dims": dims}})
for rows, cols, k in ((64, 32000, 50), (1, 1 << 20, 64), (4096, 1024, 8), (16, 4096, 256),
                      (256, 128000, 1), (8, 65536, 1024), (128, 50257, 40), (32, 4096, 16),
                      (1, 1 << 24, 100), (2048, 2048, 32)):
    entries.append({"op": "topk", "shapes": [[rows, cols]], "dtypes": ["float32"],
                    "options": {"k": k}})
json.dump(entries, open(sys.argv[1], "w"), indent=1)
print(len(entries), "items")
