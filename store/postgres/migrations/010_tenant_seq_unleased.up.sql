-- The (tenant, seq) index leaves out leased rows. Every status change is a
-- non-HOT update, so each index whose predicate holds a row version gets an
-- entry for it: the plain index took three entries per message (enqueue,
-- claim, outcome), this one takes two. Listings read the leased rows through
-- the lease index (a lease is short and the leased rows few) and merge the
-- two by seq. The predicate is on claimed_by, which a message has exactly
-- while it is PROCESSING, and not on status: no condition of the claim
-- (status = 'PENDING') implies it, so the planner cannot take this index for
-- the claim's lookups by tuple ID (an index whose predicate a statement's
-- conditions imply can be scanned whole in their place).
CREATE INDEX {{prefix}}messages_tenant_seq_unleased ON {{schema}}.{{prefix}}messages (tenant, seq)
    WHERE claimed_by IS NULL;
DROP INDEX {{schema}}.{{prefix}}messages_tenant_seq;
