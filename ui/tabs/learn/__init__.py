"""The tabs that live in their own folder: the Learn tab (course.py), a course through the theory."""
