#!/bin/sh
wc -w
