-- The open lifecycle rows' attributes indexed for containment (jsonb_path_ops: only @>, a third of
-- the default operator class's size), so a search by attribute value (`kl resources --where`,
-- /api/v1/resources?where=, the UI's search) finds the instances that may hold the value instead
-- of reading every open one: over 10,000 states and 1,000,000 instances a value one instance holds
-- took 3 s in the UI and 1 s over the API, reading them all. 44 MB there, beside 354 MB of rows.
CREATE INDEX resources_open_attributes_idx ON resources USING gin (attributes jsonb_path_ops)
    WHERE delete_serial IS NULL;

-- Whether a mark of MARKS (an instance's sensitive_attributes) is at, above or below PATH (jsonb
-- steps, a list index as its digits): then the value at PATH is a secret a search must not tell by
-- its yes or no. A function so that the planner costs it as the cheap test it is: written inline,
-- its set-returning calls were costed as a hundred rows each at every row, and a search matching
-- 190,000 of 1,000,000 instances gathered and sorted them all (280 ms) instead of walking the
-- states by name until its page was full (6 ms).
CREATE FUNCTION kl_marks_touch(marks jsonb, path text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE COST 10 AS $$
    SELECT jsonb_typeof(marks) = 'array' AND marks <> '[]' AND EXISTS (
        SELECT 1
        FROM jsonb_array_elements(marks) m(mark),
             LATERAL (SELECT ARRAY(SELECT COALESCE(s.step -> 'value' ->> 'value', s.step ->> 'value')
                                   FROM jsonb_array_elements(m.mark) WITH ORDINALITY s(step, n) ORDER BY s.n) AS steps) k
        WHERE k.steps = path[1:cardinality(k.steps)] OR path = k.steps[1:cardinality(path)])
$$;
