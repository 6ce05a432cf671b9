-- The (tenant, seq) index leaves out leased (PROCESSING) rows. Every status
-- change is a non-HOT update, so each index whose predicate holds a row
-- version gets an entry for it: the plain index took three entries per
-- message (enqueue, claim, outcome), this one takes two. Listings read the
-- leased rows through the lease index (a lease is short and the
-- leased rows few) and merge the two by seq.
CREATE INDEX {{prefix}}messages_tenant_seq_unleased ON {{schema}}.{{prefix}}messages (tenant, seq)
    WHERE status <> 'PROCESSING';
DROP INDEX {{schema}}.{{prefix}}messages_tenant_seq;
