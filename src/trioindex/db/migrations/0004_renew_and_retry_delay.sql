-- Version 4 added lease renewal and the retry delay as functions, which now live in
-- functions.sql; this version changes no table.
SELECT 1;
