"""``kaun-ir bench``: the runner, its workloads and the reference implementations it compares with."""
