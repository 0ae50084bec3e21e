# pin-requests.jq -- give every request of a JSON Lines batch the id and seed that
# `iflow-run --batch --seed SEED` would give it on one machine, so that the batch can be split
# into shards (over machines, jobs, array tasks) without changing any result.
#
#   jq -R -n -r --argjson seed SEED -f examples/pin-requests.jq < requests.jsonl > pinned.jsonl
#
# iflow-run numbers the lines of its own input: a request without "id" gets its line number,
# one without "seed" gets SEED + line - 1. A shard starts again at line 1, so those defaults
# would change with the split; here they are written into each request from its line in the
# whole file. Fields already there are kept; blank lines (not requests) are dropped; a line
# that is not a JSON object is passed on as it is (its error result then names its line in the
# shard, not in the whole file). SEED must be below 2^53 (jq computes in doubles).
foreach inputs as $line (0; . + 1;
    . as $n
    | if $line == "" then empty
      else ($line | try fromjson catch null) as $r
      | if ($r | type) == "object" then
            $r + (if $r | has("id") then {} else {id: $n} end)
               + (if $r | has("seed") then {} else {seed: ($seed + $n - 1)} end)
        else $line end
      end)
| if type == "string" then . else tojson end
