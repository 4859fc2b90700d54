from gputests import check

check.run()
