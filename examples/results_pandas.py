"""Every committed result of a state directory in a pandas DataFrame (docs/how-to/pandas.md).

python examples/results_pandas.py state
"""

import sys

import pandas as pd

from durable_dispatch import read_results

state = sys.argv[1] if len(sys.argv) > 1 else "state"
rows = [r.as_dict() for r in read_results(state)]  # commit order, one per work ID
df = pd.json_normalize(rows)  # a result {"answer": 2} becomes the column result.answer
df["committed_at"] = pd.to_datetime(df["ts"], unit="s")
df = df.set_index("work_id")
print(df[["result.answer", "rank", "epoch"]].head())
print(len(df), "results; by rank:", df.groupby("rank").size().to_dict())
