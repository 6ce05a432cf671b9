-- The claim's update (PENDING to PROCESSING) is a non-HOT update: each index
-- whose predicate holds the new row version gets an entry for it. The group
-- index held every unfinished message, PROCESSING ones included, and the
-- lease index was keyed by claimed_at: a claim wrote an entry in both. Now
-- the group index holds the waiting messages (PENDING, and the dead letters
-- that block their group) and the lease index the leased ones by group, so a
-- claim writes one entry there instead of two: the claim finds a group's
-- first unfinished message with one descent of each. Recovery reads the
-- lease index whole (the leased rows are few), and a lease renewal, which
-- changes claimed_at only, no longer touches an index key.
CREATE INDEX {{prefix}}messages_group_waiting ON {{schema}}.{{prefix}}messages (tenant, topic, grp, seq)
    WHERE (status = 'PENDING' OR blocks_group) AND grp <> '';
CREATE INDEX {{prefix}}messages_leased ON {{schema}}.{{prefix}}messages (tenant, topic, grp, seq)
    WHERE status = 'PROCESSING';
DROP INDEX {{schema}}.{{prefix}}messages_group_active;
DROP INDEX {{schema}}.{{prefix}}messages_processing;
