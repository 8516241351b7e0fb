"""What operators read and do, one module per view: the queue's status
(:mod:`.queue_status`), job listings with attempts and manual retry (:mod:`.job_listings`), a
job's timeline (:mod:`.job_timeline`), workers and the jobs they run (:mod:`.workers`), the
progress of waited-for jobs (:mod:`.wait_progress`), documents with each model's state of them
(:mod:`.document_views`), and activity over time (:mod:`.activity`).

Synchronous, one transaction each, used by the CLI, the HTTP API and the wait through
:meth:`Database.run`. Nothing here returns a claim token, chunk text or vector.
"""
